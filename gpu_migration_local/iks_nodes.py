"""Joins the IKS emulator's workers to the real control plane as Nodes, as IKS does for a real cluster.

On IKS (VPC) a worker that reaches `deployed` registers a Node named after its primary private IP, carrying the
IBM labels `ibm-cloud.kubernetes.io/worker-id`, `worker-pool-name`, `worker-pool-id`, `machine-type` and `zone`
(IBM docs "Worker node labels", ibm-cloud-docs/containers `cs_nodes.md`), and on GPU flavors `gpu-enabled=true`;
its kubelet reports the worker's version.
A deleted worker's Node goes away. GPU flavors (gx*) carry GPUs; below 1.36 IBM also installs the NVIDIA driver and
device plugin on them (the reason for this migration), so those nodes advertise nvidia.com/gpu on their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client

from iks_gpu_migration.common.versions import version_at_least
from iks_gpu_migration.plan.gates import IKS_GPU_LABEL

from .cluster_cache import ClusterCache
from .polling import Polled
from .gpu_doubles import GPUS_ANNOTATION, IBM_DRIVER_ANNOTATION

WORKER_ID_LABEL = "ibm-cloud.kubernetes.io/worker-id"


def node_name(worker: dict) -> str:
    return next(n["ipAddress"] for n in worker["networkInterfaces"] if n.get("primary"))


def node_for(worker: dict, gpus: int = 1) -> dict:
    version = worker["kubeVersion"]["actual"] or worker["kubeVersion"]["desired"]
    plain = version.split("_")[0]
    gpu = worker.get("flavor", "").startswith("gx")
    labels = {
        "kubernetes.io/hostname": node_name(worker),
        WORKER_ID_LABEL: worker["id"],
        "ibm-cloud.kubernetes.io/worker-pool-name": worker.get("poolName", ""),
        "ibm-cloud.kubernetes.io/worker-pool-id": worker.get("poolID", ""),
        "ibm-cloud.kubernetes.io/machine-type": worker.get("flavor", ""),
        "ibm-cloud.kubernetes.io/zone": worker.get("location", ""),
    }
    annotations = {"kwok.x-k8s.io/node": "fake"}
    if gpu:
        # IKS's own GPU label, there before the GPU Operator (iks_gpu_migration/plan/gates.py cites the IBM docs).
        # nvidia.com/gpu.present comes later, from the GPU Operator, once NFD has found the GPUs.
        labels[IKS_GPU_LABEL] = "true"
        annotations[GPUS_ANNOTATION] = str(gpus)
        if not version_at_least(plain, "1.36"):
            annotations[IBM_DRIVER_ANNOTATION] = "true"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name(worker), "labels": labels, "annotations": annotations},
            "status": {"nodeInfo": node_info(f"v{plain}"), **node_resources()}}


def node_resources() -> dict:
    """What a kubelet reports for a GPU flavor such as gx3.16x80.l4 (the GPUs come from the device plugin)."""
    r = {"cpu": "16", "memory": "80Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {"capacity": dict(r), "allocatable": dict(r)}


def node_info(kubelet_version: str) -> dict:
    """status.nodeInfo as a kubelet reports it (every field is required by the API types)."""
    return {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "containerd://1.7.27",
            "kernelVersion": "6.8.0-88-generic", "kubeProxyVersion": kubelet_version, "kubeletVersion": kubelet_version,
            "machineID": "", "operatingSystem": "linux", "osImage": "Ubuntu 24.04.3 LTS", "systemUUID": ""}


@dataclass
class IksNodeSync(Polled):
    """Polls the emulator's workers (in process) and keeps Nodes in step; the Nodes as the cluster cache has them, so
    one a moment behind (created or deleted already) is taken as done."""
    iks: Any  # tests.emulators.iks.IksEmulator
    api_client: client.ApiClient
    cache: ClusterCache
    interval: float = 0.05  # a pass reads the emulator in process and the cache: no request unless a Node changes
    gpus: int = 1

    def start(self) -> "IksNodeSync":
        self.core = client.CoreV1Api(self.api_client)
        self._poll("iks-nodes", self.sync)
        return self

    def sync(self) -> None:
        self.iks.run_due()  # a worker deploys at its time, not at the next request someone happens to make
        with self.iks.lock:
            workers = [dict(w, networkInterfaces=list(w["networkInterfaces"])) for w in self.iks.workers.values()]
        nodes = {n.metadata.name: n for n in self.cache.nodes() if WORKER_ID_LABEL in (n.metadata.labels or {})}
        for w in workers:
            name, state = node_name(w), w["lifecycle"]["actualState"]
            node = nodes.get(name)
            try:
                if state == "deployed" and node is None:
                    self.core.create_node(node_for(w, self.gpus))
                elif state in ("deleting", "deleted") and node is not None and \
                        node.metadata.labels.get(WORKER_ID_LABEL) == w["id"]:
                    self.core.delete_node(name)
            except client.ApiException as e:
                if e.status not in (404, 409):  # the cache had not seen this node's create or delete yet
                    raise
