// The NVIDIA device plugin's stand-in on the real v1beta1 API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): it
// serves N GPUs with NVIDIA-style UUIDs as nvidia.com/gpu, writes a CDI spec for them and answers Allocate with the
// CDI devices and NVIDIA_VISIBLE_DEVICES, as NVIDIA/k8s-device-plugin internal/plugin/server.go does. Like that
// plugin (cmd/nvidia-device-plugin/main.go), it registers again when the kubelet's socket is created anew (a kubelet
// restart), since the kubelet forgets device plugins when it restarts.
package main

import (
	"context"
	"encoding/json"
	"flag"
		"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const resource = "nvidia.com/gpu"

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	uuids []string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	devs := make([]*pluginapi.Device, 0, len(p.uuids))
	for _, u := range p.uuids {
		devs = append(devs, &pluginapi.Device{ID: u, Health: pluginapi.Healthy})
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		car := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
		visible := ""
		for i, id := range c.DevicesIds {
			car.CdiDevices = append(car.CdiDevices, &pluginapi.CDIDevice{Name: resource + "=" + id})
			if i > 0 {
				visible += ","
			}
			visible += id
		}
		car.Envs["NVIDIA_VISIBLE_DEVICES"] = visible
		log.Printf("Allocate %v", c.DevicesIds)
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp, nil
}

// writeCDI writes the CDI spec (tags.cncf.io/container-device-interface specs-go) of the GPUs: one device per UUID,
// whose only edit is the environment (there is no hardware to expose).
func writeCDI(dir string, uuids []string, kind string) error {
	devices := []map[string]any{}
	for _, u := range uuids {
		devices = append(devices, map[string]any{"name": u,
			"containerEdits": map[string]any{"env": []string{"NVIDIA_VISIBLE_DEVICES=" + u}}})
	}
	spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": kind, "devices": devices})
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "nvidia-device-plugin.json"), spec, 0o644)
}

func serve(sock string, p *plugin) (*grpc.Server, error) {
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	go func() { _ = s.Serve(l) }()
	return s, nil
}

func register(endpoint string) error {
	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource})
	return err
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

func main() {
	uuids := flag.String("uuids", "", "comma-separated UUIDs of the GPUs to offer")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where the CDI spec goes")
	flag.Parse()
	p := &plugin{uuids: strings.Split(*uuids, ",")}
	if err := writeCDI(*cdiDir, p.uuids, resource); err != nil {
		log.Fatalf("CDI spec: %v", err)
	}
	endpoint := "nvidia-gpu.sock"
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var server *grpc.Server
	var registered uint64
	for {
		// (Re-)register whenever the kubelet's socket is new: the kubelet empties the directory when it starts.
		if ino := inode(pluginapi.KubeletSocket); ino != 0 && ino != registered {
			if server != nil {
				server.Stop()
			}
			var err error
			if server, err = serve(filepath.Join(pluginapi.DevicePluginPath, endpoint), p); err != nil {
				log.Fatalf("serve: %v", err)
			}
			if err := register(endpoint); err != nil {
				log.Printf("register: %v (retrying)", err)
			} else {
				registered = ino
				log.Printf("registered %s with %d devices: %v", resource, len(p.uuids), p.uuids)
			}
		}
		select {
		case <-stop:
			if server != nil {
				server.Stop()
			}
			_ = os.Remove(filepath.Join(pluginapi.DevicePluginPath, endpoint))
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}
