"""Checks over a live cluster (a kubernetes ApiClient); each returns problems naming the node, pod or device.

An empty list means the check passed. The dynamic resources of kube/ poll these until they pass.
"""
import json
import re
from typing import Iterable, Optional

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"  # what the NVIDIA device plugin advertises by default
RESOURCE_API = "apis/resource.k8s.io/v1"
TERMINAL = ("Succeeded", "Failed")
# "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-4a1b...)" from `nvidia-smi -L`; MIG devices print "MIG-...".
GPU_UUID = re.compile(r"\bUUID:\s*((?:GPU|MIG)-[0-9A-Za-z-]+)")


def allocatable(node: client.V1Node, resource: str) -> int:
    value = ((node.status and node.status.allocatable) or {}).get(resource)
    return int(parse_quantity(value)) if value else 0


def device_plugin_gpus(node: client.V1Node, resources: Iterable[str]) -> dict[str, int]:
    """Allocatable count per resource name, only where > 0 (device plugins publish into node allocatable)."""
    counts = {r: allocatable(node, r) for r in dict.fromkeys(resources)}
    return {r: n for r, n in counts.items() if n > 0}


def slices(api: ApiClient, driver: Optional[str] = None, node: Optional[str] = None) -> list[client.V1ResourceSlice]:
    selector = ",".join(f"{k}={v}" for k, v in (("spec.driver", driver), ("spec.nodeName", node)) if v)
    return client.ResourceV1Api(api).list_resource_slice(field_selector=selector or None).items


def devices_per_node(api: ApiClient, driver: Optional[str] = None) -> dict[str, int]:
    """Number of DRA devices each node publishes (node-local slices only; GPUs are node-local)."""
    counts: dict[str, int] = {}
    for s in slices(api, driver):
        if s.spec.node_name:
            counts[s.spec.node_name] = counts.get(s.spec.node_name, 0) + len(s.spec.devices or [])
    return counts


# Operand pods by the DaemonSet names the GPU Operator gives them (NVIDIA/gpu-operator assets/state-*/*daemonset.yaml).
DRIVER_POD, TOOLKIT_POD = "nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset"
DEVICE_PLUGIN_POD, DCGM_EXPORTER_POD = "nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter"
FENCED_OPERANDS = (DRIVER_POD, DEVICE_PLUGIN_POD, TOOLKIT_POD, DCGM_EXPORTER_POD)
# The DRA chart's kubelet plugin DaemonSet, `<chart name>-kubelet-plugin` (templates/kubeletplugin.yaml); its
# container `gpus` logs the prepared claims (cmd/gpu-kubelet-plugin/driver.go).
KUBELET_PLUGIN_POD, KUBELET_PLUGIN_CONTAINER = "kubelet-plugin", "gpus"


def _operand(pod: client.V1Pod, name: str) -> bool:
    return is_operand(pod.metadata.name, name)


def is_operand(pod_name: str, operand: str) -> bool:
    """A pod of the operand's DaemonSet (named after it, as the DaemonSet controller names its pods)."""
    return pod_name.startswith(f"{operand}-")


def kubelet_plugin_pods(api: ApiClient, namespace: str, node: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    return [p for p in pods if f"-{KUBELET_PLUGIN_POD}-" in p.metadata.name]


def pod_not_ready(pod: client.V1Pod) -> str:
    """'' for a completed pod or a running pod with all containers ready, else what is wrong."""
    phase = pod.status.phase if pod.status else None
    if phase == "Succeeded":
        return ""
    statuses = (pod.status.container_statuses or []) if pod.status else []
    waiting = [f"{c.name}: {c.state.waiting.reason}" for c in statuses if c.state and c.state.waiting]
    if phase == "Running" and statuses and all(c.ready for c in statuses):
        return ""
    return f"is {phase or 'Unknown'}" + (f" ({', '.join(waiting)})" if waiting else "")


def uses_gpu(pod: client.V1Pod, extended_resource: str) -> bool:
    """Requests the extended resource (either path) or nvidia.com/gpu, or has DRA resource claims."""
    if pod.spec.resource_claims or (pod.status and pod.status.extended_resource_claim_status):
        return True
    for c in [*(pod.spec.containers or []), *(pod.spec.init_containers or [])]:
        amounts = {**((c.resources and c.resources.requests) or {}), **((c.resources and c.resources.limits) or {})}
        if any(amounts.get(r) not in (None, "0") for r in (extended_resource, GPU_RESOURCE)):
            return True
    return False


def gpu_pods(api: ApiClient, node: str, extended_resource: str) -> list[str]:
    """namespace/name of pods on the node that use GPUs and have not finished."""
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sorted(
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in pods
        if (p.status.phase if p.status else None) not in TERMINAL and uses_gpu(p, extended_resource)
    )


def requests_resource(pod: client.V1Pod, resource: str) -> bool:
    for c in [*(pod.spec.containers or []), *(pod.spec.init_containers or [])]:
        amounts = {**((c.resources and c.resources.requests) or {}), **((c.resources and c.resources.limits) or {})}
        if amounts.get(resource) not in (None, "0"):
            return True
    return False


def device_plugin_gpu_pods(api: ApiClient, node: str, resource: str) -> list[str]:
    """namespace/name of unfinished pods on the node holding `resource` through the device plugin (a request of it
    that the scheduler did not turn into a DRA claim: no status.extendedResourceClaimStatus)."""
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sorted(
        f"{p.metadata.namespace}/{p.metadata.name}" for p in pods
        if (p.status.phase if p.status else None) not in TERMINAL and requests_resource(p, resource)
        and not (p.status and p.status.extended_resource_claim_status)
    )


def pod_log(api: ApiClient, pod: client.V1Pod) -> str:
    """The pod's log, or '' if it has none (never scheduled, or its container never started)."""
    try:
        return client.CoreV1Api(api).read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace) or ""
    except ApiException as e:
        if e.status in (400, 404):
            return ""
        raise


def logged_uuids(log: str) -> list[str]:
    return list(dict.fromkeys(GPU_UUID.findall(log)))


def raw_items(response) -> list[dict]:
    """The items of a list call made with `_preload_content=False`, as the API server sent them. For the reads made
    per node of a batch over the whole cluster (every Node before each drain, every operand pod after each node):
    the client builds a typed model of every object and field, which at a batch of 50 among 200 nodes costs seconds
    of CPU per batch; plain JSON a small fraction of it (benchmarks/real_fleet.py)."""
    return json.loads(response.data)["items"]
