"""The configuration files of one real node: containerd's, the CNI network's, the kubelet's and its kubeconfig.

Paths are those the node sees in its own mount namespace (node.py): /var/lib/kubelet and /var/lib/containerd are the
node's directories bind-mounted there, /run and /var/log are the namespace's own tmpfs, as in a kind node container
(kind: pkg/cluster/internal/providers/docker/provision.go, tmpfs /run and a volume for /var). Pure functions.
"""
from __future__ import annotations

import base64
import json
import pathlib
from dataclasses import dataclass

CONTAINERD_SOCK = "/run/containerd/containerd.sock"
PAUSE_IMAGE = "registry.local/gpu-migration/pause:3.10"


@dataclass(frozen=True)
class NodeNet:
    bridge: str  # host link name (15 characters at most)
    subnet: str  # a /24 prefix, e.g. "10.213.7"

    @property
    def ip(self) -> str:
        """The node's InternalIP: the bridge's own address. The kubelet refuses a loopback --node-ip
        (pkg/kubelet/kubelet_node_status.go validateNodeIP); this one lives only on a bridge with no uplink."""
        return f"{self.subnet}.1"


def containerd_toml(tools: pathlib.Path, cni_conf: pathlib.Path, cdi: pathlib.Path) -> str:
    """containerd v2 config version 4 (version/version.go ConfigVersion). The listen address must be the grpc
    server plugin's (a top-level [grpc] address is ignored); `restrict_oom_score_adj` because this machine lacks
    CAP_SYS_RESOURCE (runc otherwise fails: "can't get final child's PID from pipe: EOF"); the CRI stream server on
    127.0.0.1 and a port the kernel picks ("0"). Keys: internal/cri/config/config.go."""
    runtime = '[plugins."io.containerd.cri.v1.runtime"]'
    return f"""version = 4
root = "/var/lib/containerd"
state = "/run/containerd"
[plugins."io.containerd.server.v1.grpc"]
  address = "{CONTAINERD_SOCK}"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "{CONTAINERD_SOCK}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
{runtime}
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{cdi}"]
{runtime[:-1]}.containerd]
  default_runtime_name = "runc"
{runtime[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{runtime[:-1]}.containerd.runtimes.runc.options]
  BinaryName = "{tools / 'runc'}"
  Root = "/run/runc"
  SystemdCgroup = false
{runtime[:-1]}.cni]
  bin_dirs = ["{tools.parent / 'cni' / 'bin'}"]
  conf_dir = "{cni_conf}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""


def cni_conflist(net: NodeNet) -> str:
    """The node's pod network: its own bridge, no gateway and no masquerade (so the plugin neither turns on
    ip_forward nor adds iptables rules, plugins/main/bridge/bridge.go), host-local addresses from the node's /24."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": "gpu-migration-pods",
        "plugins": [
            {"type": "bridge", "bridge": net.bridge, "isGateway": False, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": f"{net.subnet}.0/24",
                                                         "rangeStart": f"{net.subnet}.10"}]]}},
            {"type": "loopback"},
        ],
    }, indent=1)


def kubelet_config(net: NodeNet, port: int, cgroup_root: str, ca: pathlib.Path,
                   cert: pathlib.Path, key: pathlib.Path, node_dir: pathlib.Path) -> str:
    """KubeletConfiguration v1beta1 (k8s.io/kubelet/config/v1beta1/types.go). cgroup v1 allowed (`failCgroupV1`),
    the cgroupfs driver under the node's own cgroupRoot, no node-allocatable enforcement (the node shares the
    machine), the API only on the node IP at a free port, no read-only or healthz port, x509 clients of the
    cluster CA and webhook authorization. No feature gates: DRAExtendedResource is GA and locked on in 1.37
    (pkg/features/kube_features.go). volumePluginDir would otherwise be created under /usr/libexec."""
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": net.ip, "port": port, "readOnlyPort": 0, "healthzPort": 0,
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{cgroup_root}", "cgroupsPerQOS": True,
        "enforceNodeAllocatable": [], "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}", "imageServiceEndpoint": f"unix://{CONTAINERD_SOCK}",
        "tlsCertFile": str(cert), "tlsPrivateKeyFile": str(key),
        "authentication": {"x509": {"clientCAFile": str(ca)}, "webhook": {"enabled": True},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "Webhook"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "volumePluginDir": str(node_dir / "volume-plugins"), "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
    }, indent=1)


def kubeconfig(server: str, server_ca: pathlib.Path, cert: pathlib.Path, key: pathlib.Path) -> str:
    def b64(p: pathlib.Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "node",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": b64(server_ca)}}],
        "users": [{"name": "node", "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
    }, indent=1)
