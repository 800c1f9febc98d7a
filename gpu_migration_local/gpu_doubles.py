"""Test doubles for what can't run here — NVIDIA's operands, GPUs, the kubelet's device and DRA managers — as small
controllers against the real API server. Each behaviour follows the real component; the source is named beside it.

What is not here is the GPU Operator: its real controller runs (container_runtime.py) and labels nodes, creates its
DaemonSets and reports its ClusterPolicy itself. Node Feature Discovery's worker, which reads the node's PCI devices
and /etc/os-release, is played here (`_nfd_labels`); nfd-master and its garbage collector run as kwok pods.

Node identity: a GPU node is one that has GPUs (annotation `gpu-migration.local/gpus`, set by the IKS node double on
GPU flavors); GPU UUIDs are derived from the node name, so a test can predict them.
"""
from __future__ import annotations

import contextlib
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from kubernetes import client

from .cluster_cache import ClusterCache
from .container_runtime import os_release
from .kubelet_logs import LogStore
from .polling import Polled


GPUS_ANNOTATION = "gpu-migration.local/gpus"
# IKS GPU workers below 1.36 come with IBM-managed drivers and IBM's device plugin (../shared/reference/iks-api.md;
# IBM docs "GPU worker nodes"): the node advertises nvidia.com/gpu without the GPU Operator.
IBM_DRIVER_ANNOTATION = "gpu-migration.local/ibm-managed-driver"
# Fault injection for the smoke test: "exit=<code>" or "uuid=<wrong uuid>" on the node.
SMI_FAULT_ANNOTATION = "gpu-migration.local/nvidia-smi-fault"
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"
DRA_DRIVER = "gpu.nvidia.com"

OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"


FLAVOR_LABEL = "ibm-cloud.kubernetes.io/machine-type"


@contextlib.contextmanager
def unless_gone():
    """A node listed at the start of a pass may be deleted before the pass writes to it (its worker was replaced): as
    its kubelet and NFD would, the pass leaves it and goes on with the other nodes, instead of failing as a whole and
    holding back every other node's labels and devices for a poll interval."""
    try:
        yield
    except client.ApiException as e:
        if e.status != 404:
            raise


@dataclass(frozen=True)
class GpuModel:
    """What NVML reports for a GPU (`nvidia-smi -L` prints the name; the DRA driver publishes name, architecture and
    compute capability as device attributes, NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go)."""
    name: str
    architecture: str
    compute_capability: str
    memory: str


# The GPU of each IKS GPU flavor family, by the flavor's last part (gx3.16x80.l4, gx3.24x120.l40s,
# gx3d.160x1792.8h100, gx2.8x64.1v100: IBM docs "VPC GPU profiles"); models as NVIDIA's data sheets give them.
GPU_MODELS = {
    "l40s": GpuModel("NVIDIA L40S", "Ada Lovelace", "8.9.0", "48Gi"),
    "l4": GpuModel("NVIDIA L4", "Ada Lovelace", "8.9.0", "24Gi"),
    "h100": GpuModel("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi"),
    "v100": GpuModel("Tesla V100-PCIE-16GB", "Volta", "7.0.0", "16Gi"),
}


def gpu_model(flavor: str) -> GpuModel:
    """The GPU of `flavor`; an unknown or missing flavor gets the L4 of the local workers' gx3.16x80.l4."""
    family = re.sub(r"^\d+", "", flavor.rsplit(".", 1)[-1].lower())
    return GPU_MODELS.get(family, GPU_MODELS["l4"])


def node_gpu_model(node: client.V1Node) -> GpuModel:
    return gpu_model((node.metadata.labels or {}).get(FLAVOR_LABEL, ""))


NFD = "feature.node.kubernetes.io/"
NVIDIA_PCI_VENDOR = "10de"


def nfd_labels(node: client.V1Node, has_gpus: bool) -> dict[str, str]:
    """What nfd-worker v0.17 finds on a node, as labels (node-feature-discovery source/system/system.go: os_release ID
    and VERSION_ID with its major/minor parts; source/kernel/kernel.go: kernel-version full/major/minor/revision;
    source/pci/pci.go: `pci-<fields>.present` for devices of a whitelisted class, with the GPU Operator chart's
    `deviceLabelFields: [vendor]` and class 0302 (3D controller) whitelisted: `pci-10de.present` for NVIDIA GPUs).
    The OS and kernel are those the node's kubelet reports (status.nodeInfo)."""
    info = node.status.node_info if node.status and node.status.node_info else None
    # nfd-worker reads the host's /etc/os-release: the same file the container runtime gives a pod's hostPath.
    release = dict(line.split("=", 1) for line in os_release(node).splitlines())
    os_id, version_id = release["ID"], release["VERSION_ID"].strip('"')
    kernel = (info.kernel_version if info else "") or "6.8.0"
    k = (kernel.split("-")[0].split(".") + ["0", "0"])[:3]
    labels = {f"{NFD}system-os_release.ID": os_id, f"{NFD}system-os_release.VERSION_ID": version_id,
              f"{NFD}kernel-version.full": kernel, f"{NFD}kernel-version.major": k[0],
              f"{NFD}kernel-version.minor": k[1], f"{NFD}kernel-version.revision": k[2]}
    if "." in version_id:
        major, minor = version_id.split(".", 1)
        labels.update({f"{NFD}system-os_release.VERSION_ID.major": major,
                       f"{NFD}system-os_release.VERSION_ID.minor": minor})
    if has_gpus:
        labels[f"{NFD}pci-{NVIDIA_PCI_VENDOR}.present"] = "true"
    return labels


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{index}"))


def _running(pod: client.V1Pod) -> bool:
    return pod.status is not None and pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None


def _ready(pod: client.V1Pod) -> bool:
    return _running(pod) and any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _pod_app(pod: client.V1Pod) -> str:
    return (pod.metadata.labels or {}).get("app", "")


def _requests(pod: client.V1Pod, resource: str) -> int:
    total = 0
    for c in pod.spec.containers:
        r = (c.resources.limits or {}) if c.resources else {}
        total += int(r.get(resource, 0) or 0)
    return total


@dataclass
class GpuDoubles(Polled):
    """Runs every double in one thread, a pass on each change the cluster cache sees and at least every `interval`.
    `wipe_delay`: seconds before the kubelet wipes a departed DRA plugin's ResourceSlices (30 s in the kubelet,
    pkg/kubelet/cm/dra/manager.go; shorter here to keep tests quick)."""
    api_client: client.ApiClient
    logs: LogStore
    cache: Optional[ClusterCache] = None  # LocalCluster's; start() needs one
    operator_namespace: str = "gpu-operator"
    wipe_delay: float = 3.0
    interval: float = 0.25
    _plugin_gone_since: dict[str, float] = field(default_factory=dict)
    _prepared: set[str] = field(default_factory=set)
    _finished: set[str] = field(default_factory=set)
    _running_since: dict[str, float] = field(default_factory=dict)
    smi_fault: str = ""  # like SMI_FAULT_ANNOTATION, for every node (tests that can't know the new node's name)
    # Faults. The DRA kubelet plugin runs (Ready) but its ResourceSlices never appear, as when its service account may
    # not create them: the plugin's ResourceSlice controller (k8s.io/dynamic-resource-allocation resourceslice)
    # only logs and retries a failed create, so the pod stays Ready.
    publish_slices: bool = True
    # Another automation owns the labels of nodes with IBM-managed drivers and removes the fence
    # (nvidia.com/gpu.deploy.operands) as soon as it is set: the operator then labels those nodes like any other.
    fence_removed_by_someone: bool = False

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def start(self) -> "GpuDoubles":
        assert self.cache is not None, "GpuDoubles needs the cluster cache to run"
        self._poll("gpu-doubles", self.reconcile, self.cache.subscribe())
        return self

    # One pass over the cluster as the cache has it; the ResourceSlices are read fresh (a stale read would publish
    # a node's GPUs twice).
    def reconcile(self) -> None:
        nodes = {n.metadata.name: n for n in self.cache.nodes()}
        pods = self.cache.pods()
        self._nfd_labels(nodes, pods)
        if self.fence_removed_by_someone:
            self._remove_fences(nodes)
        by_node: dict[str, list[client.V1Pod]] = {}
        for p in pods:
            if p.spec.node_name:
                by_node.setdefault(p.spec.node_name, []).append(p)
        slices = self._slices()
        for name, node in nodes.items():
            if not self._is_gpu_node(node):
                continue
            node_pods = by_node.get(name, [])
            with unless_gone():
                self._device_plugin(node, node_pods)
                self._dra_plugin(node, node_pods, [s for s in slices if s["spec"].get("nodeName") == name])
        self._run_gpu_programs(nodes, pods)

    @staticmethod
    def _is_gpu_node(node: client.V1Node) -> bool:
        return GPUS_ANNOTATION in (node.metadata.annotations or {})

    @staticmethod
    def _gpus(node: client.V1Node) -> int:
        return int((node.metadata.annotations or {}).get(GPUS_ANNOTATION, "1"))

    def _nfd_labels(self, nodes: dict[str, client.V1Node], pods: list[client.V1Pod]) -> None:
        """Node Feature Discovery: once its worker pod runs on a node, nfd-master puts the worker's features on the
        node as labels, and keeps them (kubernetes-sigs/node-feature-discovery v0.17, the GPU Operator chart's
        subchart)."""
        workers = {p.spec.node_name for p in pods if _running(p) and (p.metadata.labels or {}).get("role") == "worker"
                   and (p.metadata.labels or {}).get("app.kubernetes.io/name") == "node-feature-discovery"}
        for name in workers & nodes.keys():
            node = nodes[name]
            want = nfd_labels(node, self._is_gpu_node(node))
            labels = node.metadata.labels or {}
            patch = {k: v for k, v in want.items() if labels.get(k) != v}
            if patch:
                with unless_gone():
                    self.core.patch_node(name, {"metadata": {"labels": patch}})

    def _remove_fences(self, nodes: dict[str, client.V1Node]) -> None:
        for node in nodes.values():
            if (node.metadata.annotations or {}).get(IBM_DRIVER_ANNOTATION) == "true" and \
                    OPERANDS_LABEL in (node.metadata.labels or {}):
                with unless_gone():
                    self.core.patch_node(node.metadata.name, {"metadata": {"labels": {OPERANDS_LABEL: None}}})

    def _device_plugin(self, node: client.V1Node, pods: list[client.V1Pod]) -> None:
        """The kubelet's device manager (pkg/kubelet/cm/devicemanager): a registered plugin's healthy devices are
        capacity and allocatable; when the plugin's endpoint stops, allocatable drops to 0 and capacity stays, at 0
        (not absent) — pkg/kubelet/nodestatus/setters.go. IBM's own plugin serves nodes with IBM-managed drivers."""
        ibm = (node.metadata.annotations or {}).get(IBM_DRIVER_ANNOTATION) == "true"
        plugin = ibm or any(_ready(p) and _pod_app(p) == "nvidia-device-plugin-daemonset" for p in pods)
        want = str(self._gpus(node)) if plugin else "0"
        cap = (node.status.capacity or {}) if node.status else {}
        alloc = (node.status.allocatable or {}) if node.status else {}
        had = DEVICE_PLUGIN_RESOURCE in cap
        if not plugin and not had:
            return  # never registered: the resource stays absent
        if cap.get(DEVICE_PLUGIN_RESOURCE) != want or alloc.get(DEVICE_PLUGIN_RESOURCE) != want:
            self.core.patch_node_status(node.metadata.name, {"status": {
                "capacity": {DEVICE_PLUGIN_RESOURCE: want}, "allocatable": {DEVICE_PLUGIN_RESOURCE: want}}})

    def _slices(self) -> list[dict]:
        return self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]

    def _dra_plugin(self, node: client.V1Node, pods: list[client.V1Pod], slices: list[dict]) -> None:
        """NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin (driver.go, deviceinfo.go): while the kubelet plugin runs
        on a node it publishes one pool named after the node with a device `gpu-<minor>` per GPU and the attributes
        `type`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`,
        `cudaDriverVersion`, `pcieBusID` and capacity `memory`. The kubelet wipes the slices of a plugin that
        unregistered after a delay (pkg/kubelet/cm/dra/manager.go)."""
        name = node.metadata.name
        plugin = next((p for p in pods if _ready(p) and p.metadata.name.startswith("nvidia-dra-driver-gpu-kubelet-plugin")),
                      None)
        mine = [s for s in slices if s["spec"].get("driver") == DRA_DRIVER]
        if plugin is not None:
            self._plugin_gone_since.pop(name, None)
            if not mine and self.publish_slices:
                self.custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                         self._slice(node))
            self._log_prepared_claims(name, plugin)
            return
        if mine:
            gone = self._plugin_gone_since.setdefault(name, time.monotonic())
            if time.monotonic() - gone >= self.wipe_delay:
                for s in mine:
                    self.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                             s["metadata"]["name"])
                self._plugin_gone_since.pop(name, None)

    def _slice(self, node: client.V1Node) -> dict:
        name, model = node.metadata.name, node_gpu_model(node)
        devices = []
        for i in range(self._gpus(node)):
            devices.append({
                "name": f"gpu-{i}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": gpu_uuid(name, i)},
                    "productName": {"string": model.name},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": model.architecture},
                    "cudaComputeCapability": {"version": model.compute_capability},
                    "driverVersion": {"version": "580.95.5"},
                    "cudaDriverVersion": {"version": "13.0.0"},
                    "pcieBusID": {"string": f"0000:{0x18 + i:02x}:00.0"},
                },
                "capacity": {"memory": {"value": model.memory}},
            })
        # Owned by the Node, so the garbage collector removes the slices with a deleted node (a replaced worker):
        # k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go PublishResources, resourceslice.Owner
        # {APIVersion v1, Kind Node, Name, UID}.
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
        return {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{name}-{DRA_DRIVER}-", "ownerReferences": [owner]},
            "spec": {"driver": DRA_DRIVER, "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
        }

    def _claims_on(self, node: str) -> list[dict]:
        claims = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")["items"]
        out = []
        for c in claims:
            results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            if any(r.get("driver") == DRA_DRIVER and r.get("pool") == node for r in results) and \
                    (c.get("status") or {}).get("reservedFor"):
                out.append(c)
        return out

    def _log_prepared_claims(self, node: str, plugin: client.V1Pod) -> None:
        """The kubelet calls NodePrepareResources before a claim's pod starts; the plugin logs at level 0, container
        `gpus`: v25.8 `Returning newly prepared devices for claim '<claimUID>': [...]` (cmd/gpu-kubelet-plugin/driver.go)."""
        for c in self._claims_on(node):
            uid = c["metadata"]["uid"]
            if uid in self._prepared:
                continue
            self._prepared.add(uid)
            devices = [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]
            self.logs.append(plugin.metadata.namespace, plugin.metadata.name, "gpus", uid=plugin.metadata.uid, line=
                             f"I1202 driver.go:150] Returning newly prepared devices for claim '{uid}': "
                             f"[{{Devices: {devices}}}]")

    def _allocated_uuids(self, pod: client.V1Pod, node: client.V1Node) -> Optional[list[str]]:
        """What the container sees: DRA devices from its claim (CDI), or the device plugin's assignment."""
        ext = getattr(pod.status, "extended_resource_claim_status", None)
        claim_name = ext.resource_claim_name if ext else None
        if claim_name:
            claim = self.custom.get_namespaced_custom_object("resource.k8s.io", "v1", pod.metadata.namespace,
                                                             "resourceclaims", claim_name)
            results = claim["status"]["allocation"]["devices"]["results"]
            return [gpu_uuid(r["pool"], int(r["device"].split("-")[1])) for r in results]
        n = _requests(pod, DEVICE_PLUGIN_RESOURCE)
        if n:
            return [gpu_uuid(node.metadata.name, i) for i in range(n)]
        return None

    def _run_gpu_programs(self, nodes: dict[str, client.V1Node], pods: list[client.V1Pod]) -> None:
        """The container runtime for pods whose program ends (restartPolicy Never/OnFailure): `nvidia-smi -L` prints
        one line per visible GPU (format in ../shared/reference/nvidia-dra.md) and exits 0; no GPU visible -> exit 6
        ("No devices were found"). A `sleep N` in the program holds the pod Running for N seconds first. Other
        programs exit 0. Fault injection on the node via SMI_FAULT_ANNOTATION."""
        for pod in pods:
            uid = pod.metadata.uid
            if uid in self._finished or not _running(pod) or pod.spec.restart_policy == "Always":
                continue
            node = nodes.get(pod.spec.node_name)
            if node is None:
                continue
            container = pod.spec.containers[0]
            program = " ".join([*(container.command or []), *(container.args or [])])
            hold = sum(float(m) for m in re.findall(r"\bsleep\s+(\d+(?:\.\d+)?)", program))
            started = self._running_since.setdefault(uid, time.monotonic())
            if time.monotonic() - started < hold:
                continue
            self._finished.add(uid)
            exit_code = 0
            if "nvidia-smi" in program:
                uuids = self._allocated_uuids(pod, node) or []
                fault = (node.metadata.annotations or {}).get(SMI_FAULT_ANNOTATION, "") or self.smi_fault
                if fault.startswith("uuid="):
                    uuids = [fault.split("=", 1)[1]]
                for i, u in enumerate(uuids):
                    self.logs.append(pod.metadata.namespace, pod.metadata.name, container.name,
                                     f"GPU {i}: {node_gpu_model(node).name} (UUID: {u})", uid)
                if not uuids:
                    self.logs.append(pod.metadata.namespace, pod.metadata.name, container.name,
                                     "No devices were found", uid)
                    exit_code = 6
                if fault.startswith("exit="):
                    exit_code = int(fault.split("=", 1)[1])
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
                "containerStatuses": [{
                    "name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0,
                    "started": False, "state": {"terminated": {
                        "exitCode": exit_code if c.name == container.name else 0,
                        "reason": "Completed" if exit_code == 0 else "Error", "startedAt": now, "finishedAt": now}},
                } for c in pod.spec.containers],
            }})
