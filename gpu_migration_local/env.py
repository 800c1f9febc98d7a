"""The whole local environment: real control plane, the container runtime that runs the real GPU Operator, kubelet log
double, GPU doubles and the kwok resync (kwok_resync.py), started and stopped together."""
from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass, field
from typing import Optional

from kubernetes import client, config as kconfig

from . import tools
from .cluster_cache import ClusterCache
from .container_runtime import ContainerRuntime, Image, check_isolation
from .control_plane import ControlPlane, NodeHealth, remove_workdir, self_signed_cert, temp_workdir
from .gpu_doubles import GpuDoubles
from .kubelet_logs import KubeletLogServer, LogStore
from .kwok_resync import KwokResync

log = logging.getLogger("gpu-migration-local")


@dataclass
class LocalCluster:
    workdir: pathlib.Path = field(default_factory=temp_workdir)
    wipe_delay: float = 3.0
    keep_workdir: bool = False
    control_plane: Optional[ControlPlane] = None
    logs: LogStore = field(default_factory=LogStore)
    log_server: Optional[KubeletLogServer] = None
    doubles: Optional[GpuDoubles] = None
    kwok_resync: Optional[KwokResync] = None
    runtime: Optional[ContainerRuntime] = None
    api_client: Optional[client.ApiClient] = None
    cache: Optional[ClusterCache] = None  # Nodes and Pods for the doubles (cluster_cache.py)
    node_health: NodeHealth = NodeHealth()

    @property
    def kubeconfig(self) -> pathlib.Path:
        assert self.control_plane is not None
        return self.control_plane.kubeconfig

    def start(self) -> "LocalCluster":
        try:
            check_isolation()
            cert, key = self_signed_cert(self.workdir, "kubelet")
            self.log_server = KubeletLogServer(self.logs, cert, key).start()
            self.control_plane = ControlPlane(self.workdir, tools.bin_dir(), kubelet_port=self.log_server.port,
                                              node_health=self.node_health)
            self.control_plane.start()
            self.api_client = kconfig.new_client_from_config(str(self.kubeconfig))
            self.cache = ClusterCache(self.api_client).start()
            self.doubles = GpuDoubles(self.api_client, self.logs, self.cache, wipe_delay=self.wipe_delay).start()
            self.kwok_resync = KwokResync(self.api_client, self.cache).start()
            self.runtime = ContainerRuntime(self.api_client, self.logs, operator_images(), self.workdir,
                                            self.control_plane.apiserver_port, self.control_plane.ca_file,
                                            self.cache).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.runtime:
            self.runtime.stop()
        if self.doubles:
            self.doubles.stop()
        if self.kwok_resync:
            self.kwok_resync.stop()
        if self.cache:
            self.cache.stop()
        if self.control_plane:
            self.control_plane.stop()
        if self.log_server:
            self.log_server.stop()
        if not self.keep_workdir:
            remove_workdir(self.workdir)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def operator_images() -> dict[str, Image]:
    """The GPU Operator's image (the chart's operator.repository/image, nvcr.io/nvidia/gpu-operator), run from what
    tools/build made of its module. Its Deployment's ports (metrics :8080, probes :8081) would open on this machine,
    not in a pod's network namespace: its own flags turn them off (cmd/gpu-operator/main.go)."""
    return {"nvcr.io/nvidia/gpu-operator": Image(
        "nvcr.io/nvidia/gpu-operator", tools.gpu_operator_root(),
        no_listen=("--metrics-bind-address=0", "--health-probe-bind-address=0"))}
