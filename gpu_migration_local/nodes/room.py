"""The nodes room: real kubelet nodes joined to a local control plane started with `real_nodes=True`.

`NodesRoom(control_plane, workdir).start()` first undoes what a killed run left on the host (host.undo_leftovers),
then builds the images (pause, GPU workload) once; `add_node(name)` starts a node and waits until it is Ready;
`stop()` stops every node and undoes every host change in reverse. The GPU stand-ins (device plugin, DRA kubelet
plugin) run in a node's namespace with `start_device_plugin` / `start_dra_plugin`.
"""
from __future__ import annotations

import ipaddress
import pathlib
import secrets
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import Optional

from kubernetes import client, config as kconfig

from .. import tools
from ..control_plane import ControlPlane
from . import config, host, images
from .node import RealNode, free_port_on, wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]
# Where each room records its host changes; the clone's own, so its next start finds what a killed run left.
LEDGERS = REPO / ".local" / "real-nodes"
WORKLOAD_IMAGE = "registry.local/gpu-migration/gpu-workload:1"
# A private range for the nodes' /24s, skipped where the host already has an address or route in it.
NODE_NETS = ipaddress.ip_network("10.213.0.0/16")
# Nodes this process saw Ready (the CI summary line names them: tests/conftest.py).
nodes_started = 0


def gpu_uuids(node: str, count: int) -> list[str]:
    """The same UUIDs the GPU doubles give a node (gpu_doubles.gpu_uuid), NVIDIA's GPU-<uuid> form."""
    return ["GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{i}")) for i in range(count)]


def _used_subnets() -> set[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    out += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    return {".".join(w.split("/")[0].split(".")[:3]) for w in out.split() if w.count(".") == 3}


@dataclass
class NodesRoom:
    control_plane: ControlPlane
    workdir: pathlib.Path
    ledgers: pathlib.Path = LEDGERS
    ready_timeout: float = 60.0
    nodes: dict[str, RealNode] = field(default_factory=dict)
    ledger: Optional[host.Ledger] = None
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    archives: dict[str, pathlib.Path] = field(default_factory=dict)

    @property
    def api(self) -> client.CoreV1Api:
        return client.CoreV1Api(kconfig.new_client_from_config(str(self.control_plane.kubeconfig)))

    def start(self) -> "NodesRoom":
        if self.control_plane.ca is None:
            raise RuntimeError("real nodes need a control plane started with real_nodes=True (Node authorizer, "
                               "NodeRestriction, the cluster CA)")
        host.undo_leftovers(self.ledgers)
        self.ledger = host.Ledger(self.ledgers)
        self.ledger.record("sysctl", path="/proc/sys/net/ipv4/ip_forward",
                           old=pathlib.Path("/proc/sys/net/ipv4/ip_forward").read_text().strip())
        self.workdir.mkdir(parents=True, exist_ok=True)
        stand_ins = tools.gpu_stand_ins()
        self.archives = {
            config.PAUSE_IMAGE: images.write_archive(config.PAUSE_IMAGE, stand_ins / "pause",
                                                     self.workdir / "pause.tar", "/pause"),
            WORKLOAD_IMAGE: images.write_archive(WORKLOAD_IMAGE, stand_ins / "gpu-workload",
                                                 self.workdir / "gpu-workload.tar", "/gpu-workload",
                                                 also=("/bin/sh", "/bin/sleep", "/usr/bin/nvidia-smi")),
        }
        return self

    def _subnet(self) -> str:
        taken = _used_subnets() | {n.net.subnet for n in self.nodes.values()}
        for net in NODE_NETS.subnets(new_prefix=24):
            prefix = ".".join(str(net.network_address).split(".")[:3])
            if prefix not in taken and not prefix.endswith(".0"):
                return prefix
        raise RuntimeError(f"no free /24 left in {NODE_NETS} for a node's bridge")

    def add_node(self, name: str, timeout: float = 120.0) -> RealNode:
        """Starts a node and waits until the API server shows it Ready."""
        assert self.ledger is not None, "start() first"
        index = len(self.nodes)
        node = RealNode(name, self.workdir / name, tools.bin_dir(), self.ledger,
                        config.NodeNet(f"gm{self.tag}n{index}", self._subnet()), f"gpu-migration-{self.tag}-{name}")
        self.nodes[name] = node
        node.start_namespace()
        node.start_containerd(timeout)
        for archive in self.archives.values():
            node.import_image(archive)
        cp, pki = self.control_plane, node.dir / "pki"
        pki.mkdir(exist_ok=True)
        assert cp.ca is not None
        cert, key = cp.ca.node_client(name)
        kubeconfig = node.dir / "kubeconfig"
        kubeconfig.write_text(config.kubeconfig(cp.server, cp.ca_file, cert, key))
        kubeconfig.chmod(0o600)
        serving_cert, serving_key = cp.ca.kubelet_serving(name, node.net.ip)
        kubelet_cfg = node.dir / "kubelet.json"
        kubelet_cfg.write_text(config.kubelet_config(node.net, free_port_on(node.net.ip), node.cgroup, cp.ca.cert,
                                                     serving_cert, serving_key, node.dir))
        kubelet = node.start_kubelet(kubeconfig, kubelet_cfg)
        self.wait_ready(name, timeout, kubelet)
        global nodes_started
        nodes_started += 1
        return node

    def node_state(self, name: str) -> Optional[str]:
        """None when Ready, else what the API server shows."""
        try:
            n = self.api.read_node(name)
        except client.ApiException as e:
            return f"no Node {name} ({e.status})"
        ready = [c for c in n.status.conditions or [] if c.type == "Ready"]
        if ready and ready[0].status == "True":
            return None
        return f"Ready={ready[0].status}: {ready[0].message}" if ready else "no Ready condition yet"

    def wait_ready(self, name: str, timeout: float, kubelet=None) -> None:
        node = self.nodes[name]
        kubelet = kubelet or node.processes.get("kubelet")
        wait_for(f"node {name} Ready", lambda: self.node_state(name), timeout,
                 lambda: "--- kubelet log\n" + (kubelet.tail(25) if kubelet else "(not running)"),
                 kubelet.check_alive if kubelet else (lambda: None))

    def start_device_plugin(self, name: str, gpus: int = 2):
        node = self.nodes[name]
        return node.run_in_namespace("device-plugin", [
            str(tools.gpu_stand_ins() / "device-plugin"), "--uuids", ",".join(gpu_uuids(name, gpus)),
            "--cdi-dir", str(node.dir / "cdi")])

    def start_dra_plugin(self, name: str, gpus: int = 2):
        node = self.nodes[name]
        return node.run_in_namespace("dra-plugin", [
            str(tools.gpu_stand_ins() / "dra-plugin"), "--node", name,
            "--kubeconfig", str(self.control_plane.kubeconfig), "--uuids", ",".join(gpu_uuids(name, gpus)),
            "--cdi-dir", str(node.dir / "cdi")])

    def stop(self) -> None:
        errors = []
        for node in self.nodes.values():
            try:
                node.stop()
            except Exception as e:  # noqa: BLE001 - every node is stopped; the ledger undoes the rest
                errors.append(f"{node.name}: {e}")
        if self.ledger is not None:
            errors += self.ledger.undo()
        self.nodes.clear()
        if errors:
            raise RuntimeError("stopping the real nodes left: " + "; ".join(errors))

    def __enter__(self) -> "NodesRoom":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
