"""Checks over a live cluster (a kubernetes ApiClient); each returns problems naming the node, pod or device.

An empty list means the check passed. The dynamic providers in kube_providers poll these until they pass.
"""
import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"  # what the NVIDIA device plugin advertises by default
RESOURCE_API = "apis/resource.k8s.io/v1"
DEVICE_CLASS_SPEC = "io.k8s.api.resource.v1.DeviceClassSpec"
TERMINAL = ("Succeeded", "Failed")
# "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-4a1b...)" from `nvidia-smi -L`; MIG devices print "MIG-...".
GPU_UUID = re.compile(r"\bUUID:\s*((?:GPU|MIG)-[0-9A-Za-z-]+)")


def get_json(api: ApiClient, path: str) -> dict:
    """GET a non-resource path (e.g. /openapi/v3) with the client's auth and TLS settings."""
    response = api.call_api(*api.param_serialize("GET", path, auth_settings=["BearerToken"]))
    response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path} returned HTTP {response.status}: {response.data[:200]!r}")
    return json.loads(response.data)


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


def openapi_problems(api: ApiClient) -> list[str]:
    """The API server must know DeviceClassSpec.extendedResourceName (DRAExtendedResource, k8s >= 1.34)."""
    entry = get_json(api, "/openapi/v3").get("paths", {}).get(RESOURCE_API)
    if not entry:
        return [f"API server OpenAPI v3 has no {RESOURCE_API}: DRA (resource.k8s.io/v1) is not served"]
    schemas = get_json(api, entry["serverRelativeURL"]).get("components", {}).get("schemas", {})
    if "extendedResourceName" not in schemas.get(DEVICE_CLASS_SPEC, {}).get("properties", {}):
        return [
            f"API server OpenAPI {RESOURCE_API} has no {DEVICE_CLASS_SPEC}.extendedResourceName: "
            "DRA extended resources (feature gate DRAExtendedResource) are not available"
        ]
    return []


def preflight(
    api: ApiClient, driver: str, extended_resource: str, dra_nodes: list[str], all_nodes: list[str],
    device_plugin_resource: str = GPU_RESOURCE,
) -> list[str]:
    """DRA is served, driver slices exist exactly on the dra nodes, and no node offers GPUs on both paths."""
    problems = openapi_problems(api)
    devices = devices_per_node(api, driver)
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    for name in all_nodes:
        if name not in nodes:
            problems.append(f"node {name}: not found in the cluster")
    for name in dra_nodes:
        if not devices.get(name):
            problems.append(f"node {name}: no ResourceSlice devices of driver {driver} (stage dra)")
    for name, count in sorted(devices.items()):
        if count and name not in dra_nodes:
            problems.append(f"node {name}: publishes {count} DRA devices of driver {driver} but is not a dra node")
        offered = device_plugin_gpus(nodes[name], (extended_resource, device_plugin_resource, GPU_RESOURCE)) if name in nodes else {}
        if count and offered:
            problems.append(
                f"node {name}: GPUs offered twice: device plugin allocatable {offered} "
                f"and {count} DRA devices of driver {driver}"
            )
    return problems


def operator_ready(
    api: ApiClient, node: str, namespace: str, stage: str, driver: Optional[str] = None, resource: str = GPU_RESOURCE
) -> list[str]:
    """GPU Operator operand pods on the node are running/completed, and the node's GPUs are allocatable
    (`resource`, the device plugin's resource name, on device-plugin nodes; DRA devices on dra nodes)."""
    core = client.CoreV1Api(api)
    problems = []
    pods = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    if not pods:
        problems.append(f"node {node}: no GPU Operator pods in namespace {namespace}")
    for pod in pods:
        if state := pod_not_ready(pod):
            problems.append(f"node {node}: pod {namespace}/{pod.metadata.name} {state}")
    if stage == "dra":
        if not devices_per_node(api, driver).get(node):
            problems.append(f"node {node}: no DRA devices in ResourceSlices{f' of driver {driver}' if driver else ''}")
    elif not allocatable(core.read_node(node), resource):
        problems.append(f"node {node}: {resource} allocatable is 0 (device plugin not serving)")
    return problems


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


@dataclass
class SmokeResult:
    problems: list[str] = field(default_factory=list)
    gpu_uuid: str = ""
    device: str = ""  # <driver>/<pool>/<device>
    claim: str = ""  # namespace/name of the ResourceClaim generated for the pod


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


def device_uuid(api: ApiClient, driver: str, pool: str, device: str) -> str:
    """The uuid attribute of a published device ('uuid' is qualified by the driver's domain by default)."""
    for s in slices(api, driver):
        if s.spec.pool.name != pool:
            continue
        for d in s.spec.devices or []:
            if d.name == device:
                attrs = d.attributes or {}
                attr = attrs.get("uuid") or attrs.get(f"{driver}/uuid")
                return (attr.string or "") if attr else ""
    return ""


def scheduling_problems(api: ApiClient, pod: client.V1Pod, node: str) -> list[str]:
    name = f"{pod.metadata.namespace}/{pod.metadata.name}"
    problems = []
    if pod.spec.node_name != node:
        problems.append(f"criterion 1 (scheduling): pod {name} is on node {pod.spec.node_name!r}, expected {node!r}")
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == "PodScheduled" and c.status == "False":
            problems.append(f"criterion 1 (scheduling): pod {name} PodScheduled=False {c.reason}: {c.message}")
    events = client.CoreV1Api(api).list_namespaced_event(
        pod.metadata.namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod.metadata.name}"
    ).items
    for e in events:
        if e.reason == "FailedScheduling" and (not e.involved_object.uid or e.involved_object.uid == pod.metadata.uid):
            problems.append(f"criterion 1 (scheduling): pod {name} event FailedScheduling: {e.message}")
    return problems


def allocation(api: ApiClient, pod: client.V1Pod, driver: str, extended_resource: str, result: SmokeResult) -> None:
    """Fill result.claim/device from the pod's DRA extended-resource claim, or add a criterion-2 problem."""
    name = f"{pod.metadata.namespace}/{pod.metadata.name}"
    status = pod.status.extended_resource_claim_status if pod.status else None
    if not status:
        result.problems.append(
            f"criterion 2 (allocation): pod {name} has no status.extendedResourceClaimStatus "
            f"({extended_resource} was not allocated through DRA)"
        )
        return
    requests = {m.request_name for m in status.request_mappings or [] if m.resource_name == extended_resource}
    result.claim = f"{pod.metadata.namespace}/{status.resource_claim_name}"
    claim = client.ResourceV1Api(api).read_namespaced_resource_claim(status.resource_claim_name, pod.metadata.namespace)
    alloc = claim.status.allocation if claim.status else None
    results = (alloc.devices.results or []) if alloc and alloc.devices else []
    ours = [r for r in results if r.driver == driver and (not requests or r.request in requests)]
    if not ours:
        seen = [f"{r.driver}/{r.pool}/{r.device} (request {r.request})" for r in results] or "no devices"
        result.problems.append(
            f"criterion 2 (allocation): ResourceClaim {result.claim} has no device of driver {driver} "
            f"for requests {sorted(requests)}; allocation: {seen}"
        )
        return
    r = ours[0]
    result.device = f"{r.driver}/{r.pool}/{r.device}"
    result.gpu_uuid = device_uuid(api, r.driver, r.pool, r.device)


def verify_smoke(
    api: ApiClient, namespace: str, pod_name: str, node: str, driver: str, extended_resource: str
) -> SmokeResult:
    """The four smoke-test criteria for a finished pod; each problem says which criterion failed and what was seen."""
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(pod_name, namespace)
    name = f"{namespace}/{pod_name}"
    result = SmokeResult(problems=scheduling_problems(api, pod, node))
    allocation(api, pod, driver, extended_resource, result)

    # (3) the GPU the container saw is the one DRA allocated.
    log = pod_log(api, pod)
    seen = logged_uuids(log)
    if not seen:
        result.problems.append(f"criterion 3 (GPU in logs): pod {name} logs name no GPU UUID; logs: {log[-300:]!r}")
    elif result.device and not result.gpu_uuid:
        result.problems.append(
            f"criterion 3 (GPU in logs): allocated device {result.device} has no uuid attribute in its ResourceSlice"
        )
    elif result.gpu_uuid and seen != [result.gpu_uuid]:
        result.problems.append(
            f"criterion 3 (GPU in logs): pod {name} logs name {seen}, allocated device {result.device} "
            f"is {result.gpu_uuid}"
        )

    # (4) the GPU operation succeeded.
    phase = pod.status.phase if pod.status else None
    statuses = (pod.status.container_statuses or []) if pod.status else []
    terminated = [(c.name, c.state.terminated) for c in statuses if c.state and c.state.terminated]
    exits = [f"{n} exit {t.exit_code} ({t.reason})" for n, t in terminated]
    if phase != "Succeeded" or any(t.exit_code for _, t in terminated):
        result.problems.append(
            f"criterion 4 (GPU operation): pod {name} phase {phase}, containers: {exits or 'not terminated'}"
        )
    return result
