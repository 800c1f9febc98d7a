// The NVIDIA DRA driver's kubelet plugin stand-in (driver gpu.nvidia.com) on the real helper
// k8s.io/dynamic-resource-allocation/kubeletplugin: it registers with the kubelet, publishes one pool named after the
// node with a device gpu-<i> per GPU and the attributes NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin
// (deviceinfo.go) publishes, and prepares a claim by naming the CDI device of each allocated GPU (a static CDI spec
// written at start, whose only edit is NVIDIA_VISIBLE_DEVICES: there is no hardware to expose).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

const (
	driver  = "gpu.nvidia.com"
	cdiKind = "k8s.gpu.nvidia.com/device"
)

type plugin struct{ uuids map[string]string } // device name -> GPU UUID

func (p *plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var r kubeletplugin.PrepareResult
		for _, a := range c.Status.Allocation.Devices.Results {
			if a.Driver != driver {
				continue
			}
			if _, ok := p.uuids[a.Device]; !ok {
				r.Err = fmt.Errorf("claim %s/%s: no device %s here", c.Namespace, c.Name, a.Device)
				break
			}
			r.Devices = append(r.Devices, kubeletplugin.Device{Requests: []string{a.Request}, PoolName: a.Pool,
				DeviceName: a.Device, CDIDeviceIDs: []string{cdiKind + "=" + a.Device}})
		}
		log.Printf("NodePrepareResources %s/%s: %d devices", c.Namespace, c.Name, len(r.Devices))
		out[c.UID] = r
	}
	return out, nil
}

func (p *plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		log.Printf("NodeUnprepareResources %s", c.String())
		out[c.UID] = nil
	}
	return out, nil
}

func (p *plugin) HandleError(_ context.Context, err error, msg string) { log.Printf("%s: %v", msg, err) }

func (p *plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func ver(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &s} }

func devices(uuids []string, product, arch, cc, memory string) []resourceapi.Device {
	var out []resourceapi.Device
	for i, u := range uuids {
		out = append(out, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": str("gpu"), "uuid": str(u), "productName": str(product), "brand": str("Nvidia"),
				"architecture": str(arch), "cudaComputeCapability": ver(cc), "driverVersion": ver("580.95.5"),
				"cudaDriverVersion": ver("13.0.0"), "pcieBusID": str(fmt.Sprintf("0000:%02x:00.0", 0x18+i)),
				"index": {IntValue: ptr.To(int64(i))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(memory)}},
		})
	}
	return out
}

func writeCDI(dir string, uuids []string) error {
	var devs []map[string]any
	for i, u := range uuids {
		devs = append(devs, map[string]any{"name": fmt.Sprintf("gpu-%d", i),
			"containerEdits": map[string]any{"env": []string{"NVIDIA_VISIBLE_DEVICES=" + u}}})
	}
	spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": cdiKind, "devices": devs})
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "nvidia-dra-driver.json"), spec, 0o644)
}

func main() {
	node := flag.String("node", "", "node name")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the plugin's identity")
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	uuids := flag.String("uuids", "", "comma-separated GPU UUIDs")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where the CDI spec goes")
	product := flag.String("product", "NVIDIA L4", "productName")
	arch := flag.String("architecture", "Ada Lovelace", "architecture")
	cc := flag.String("compute-capability", "8.9.0", "cudaComputeCapability")
	memory := flag.String("memory", "24Gi", "capacity memory")
	flag.Parse()
	list := strings.Split(*uuids, ",")
	if err := writeCDI(*cdiDir, list); err != nil {
		log.Fatalf("CDI spec: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	p := &plugin{uuids: map[string]string{}}
	for i, u := range list {
		p.uuids[fmt.Sprintf("gpu-%d", i)] = u
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	pluginDir := filepath.Join(*kubeletDir, "plugins", driver)
	registry := filepath.Join(*kubeletDir, "plugins_registry")
	for _, d := range []string{pluginDir, registry} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			log.Fatalf("%s: %v", d, err)
		}
	}
	helper, err := kubeletplugin.Start(ctx, p, kubeletplugin.DriverName(driver), kubeletplugin.NodeName(*node),
		kubeletplugin.KubeClient(client), kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registry), kubeletplugin.HealthService(false))
	if err != nil {
		log.Fatalf("start: %v", err)
	}
	defer helper.Stop()
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices(list, *product, *arch, *cc, *memory)}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{*node: pool}}); err != nil {
		log.Fatalf("publish: %v", err)
	}
	log.Printf("registered %s on %s with %d devices", driver, *node, len(list))
	<-ctx.Done()
}
