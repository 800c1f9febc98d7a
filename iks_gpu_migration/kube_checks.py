"""Checks over a live cluster (a kubernetes ApiClient); each returns problems naming the node, pod or device.

An empty list means the check passed. The dynamic providers in kube_providers poll these until they pass.
"""
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

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


PROBE_CLASS = "gpu-migration-preflight-probe"


def stores_extended_resource_name(api: ApiClient, extended_resource: str) -> list[str]:
    """Proof that the API server stores DeviceClassSpec.extendedResourceName: a server-side dry-run create, read back.

    An API server with the DRAExtendedResource gate off accepts the object and drops the field (kubernetes
    pkg/registry/resource/deviceclass/strategy.go, dropDisabledDRAExtendedResourceFields); an OpenAPI schema listing
    the field proves nothing about the gate. Nothing is persisted (dryRun=All)."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": PROBE_CLASS},
            "spec": {"extendedResourceName": extended_resource}}
    try:
        created = client.ResourceV1Api(api).create_device_class(body, dry_run="All")
    except ApiException as e:
        if e.status == 404:
            return [f"API server does not serve {RESOURCE_API} DeviceClasses: DRA (resource.k8s.io/v1) is not served"]
        if e.status != 409:  # 409: a leftover probe exists; the read-back below cannot run, say so
            raise
        return [f"DeviceClass {PROBE_CLASS} exists (left from an earlier probe?); delete it and retry"]
    stored = created.spec.extended_resource_name if created.spec else None
    if stored != extended_resource:
        return [
            f"API server dropped DeviceClass spec.extendedResourceName on a dry-run create (sent "
            f"{extended_resource!r}, read back {stored!r}): DRA extended resources (feature gate DRAExtendedResource, "
            "GA in 1.37) are not enabled"
        ]
    return []


def device_class_conflicts(api: ApiClient, extended_resource: str, own_class: str) -> list[str]:
    """Another DeviceClass mapping the same extended resource: the one created later wins (KEP-5004), so which GPUs
    serve `extended_resource` would depend on creation order. Chart >= 25.12 installs gpu.nvidia.com mapping
    nvidia.com/gpu (NVIDIA/k8s-dra-driver-gpu templates/deviceclass-gpu.yaml)."""
    others = sorted(
        c.metadata.name for c in client.ResourceV1Api(api).list_device_class().items
        if c.spec and c.spec.extended_resource_name == extended_resource and c.metadata.name != own_class
    )
    return [f"DeviceClass {name} also maps extended resource {extended_resource} (the later-created class wins); "
            f"delete it, or let {own_class} be the only one" for name in others]


def preflight(
    api: ApiClient, driver: str, extended_resource: str, dra_nodes: list[str], all_nodes: list[str],
    device_plugin_resource: str = GPU_RESOURCE, device_class: Optional[str] = None, pilot_label: Optional[str] = None,
) -> list[str]:
    """The API server stores extendedResourceName, one DeviceClass maps it, driver slices exist exactly on the dra
    nodes, and no node offers GPUs on both paths.

    With `pilot_label` (`key=value`) the check covers one batch: `dra_nodes`/`all_nodes` are the batch's, and a node
    outside the batch may publish only if it carries the pilot label (a dra node of another batch; the DRA driver's
    kubelet plugin runs only there)."""
    problems = stores_extended_resource_name(api, extended_resource)
    if device_class:
        problems += device_class_conflicts(api, extended_resource, device_class)
    devices = devices_per_node(api, driver)
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    for name in all_nodes:
        if name not in nodes:
            problems.append(f"node {name}: not found in the cluster")
    for name in dra_nodes:
        if not devices.get(name):
            problems.append(f"node {name}: no ResourceSlice devices of driver {driver} (stage dra)")
    key, _, value = (pilot_label or "").partition("=")

    def may_publish(name: str) -> bool:
        if name in dra_nodes:
            return True
        if not pilot_label or name in all_nodes:
            return False
        return name in nodes and (nodes[name].metadata.labels or {}).get(key) == value

    for name, count in sorted(devices.items()):
        if count and not may_publish(name):
            problems.append(f"node {name}: publishes {count} DRA devices of driver {driver} but is not a dra node")
        offered = device_plugin_gpus(nodes[name], (extended_resource, device_plugin_resource, GPU_RESOURCE)) if name in nodes else {}
        if count and offered:
            problems.append(
                f"node {name}: GPUs offered twice: device plugin allocatable {offered} "
                f"and {count} DRA devices of driver {driver}"
            )
    return problems


# Operand pods by the DaemonSet names the GPU Operator gives them (NVIDIA/gpu-operator assets/state-*/*daemonset.yaml).
DRIVER_POD, TOOLKIT_POD = "nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset"
DEVICE_PLUGIN_POD, DCGM_EXPORTER_POD = "nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter"
FENCED_OPERANDS = (DRIVER_POD, DEVICE_PLUGIN_POD, TOOLKIT_POD, DCGM_EXPORTER_POD)
# The DRA chart's kubelet plugin DaemonSet, `<chart name>-kubelet-plugin` (templates/kubeletplugin.yaml); its
# container `gpus` logs the prepared claims (cmd/gpu-kubelet-plugin/driver.go).
KUBELET_PLUGIN_POD, KUBELET_PLUGIN_CONTAINER = "kubelet-plugin", "gpus"


def _operand(pod: client.V1Pod, name: str) -> bool:
    return pod.metadata.name.startswith(f"{name}-")


def kubelet_plugin_pods(api: ApiClient, namespace: str, node: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    return [p for p in pods if f"-{KUBELET_PLUGIN_POD}-" in p.metadata.name]


def operator_ready(
    api: ApiClient, node: str, namespace: str, stage: str, driver: Optional[str] = None, resource: str = GPU_RESOURCE,
    dra_namespace: Optional[str] = None,
) -> list[str]:
    """The node's GPUs are usable on its stage's path.

    device-plugin: every GPU Operator pod on the node running/completed, and `resource` allocatable.
    dra: only the operands that must run there: driver and toolkit Ready, the DRA kubelet plugin Ready, and DRA
    devices published. Not "all pods": the operator validator's plugin-validation init container waits for
    nvidia.com/gpu capacity, which a node without the device plugin never gets, so it loops there
    (NVIDIA/gpu-operator cmd/nvidia-validator/main.go)."""
    core = client.CoreV1Api(api)
    problems = []
    pods = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    if stage == "dra":
        for operand in (DRIVER_POD, TOOLKIT_POD):
            mine = [p for p in pods if _operand(p, operand)]
            if not mine:
                problems.append(f"node {node}: no {operand} pod in namespace {namespace}")
            problems += [f"node {node}: pod {namespace}/{p.metadata.name} {state}"
                         for p in mine if (state := pod_not_ready(p))]
        if dra_namespace:
            plugins = kubelet_plugin_pods(api, dra_namespace, node)
            if not plugins:
                problems.append(f"node {node}: no DRA kubelet plugin pod in namespace {dra_namespace}")
            problems += [f"node {node}: pod {dra_namespace}/{p.metadata.name} {state}"
                         for p in plugins if (state := pod_not_ready(p))]
        if not devices_per_node(api, driver).get(node):
            problems.append(f"node {node}: no DRA devices in ResourceSlices{f' of driver {driver}' if driver else ''}")
        return problems
    if not pods:
        problems.append(f"node {node}: no GPU Operator pods in namespace {namespace}")
    for pod in pods:
        if state := pod_not_ready(pod):
            problems.append(f"node {node}: pod {namespace}/{pod.metadata.name} {state}")
    if not allocatable(core.read_node(node), resource):
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


def pending_gpu_pods(api: ApiClient, resources: Iterable[str]) -> list[str]:
    """Pods requesting a GPU resource that are still Pending, each with its scheduling reason."""
    found = []
    for p in client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector="status.phase=Pending").items:
        if not (p.spec.resource_claims or any(requests_resource(p, r) for r in resources)):
            continue
        reasons = [f"{c.reason}: {c.message}" for c in (p.status.conditions or []) if p.status
                   if c.type == "PodScheduled" and c.status == "False"]
        found.append(f"{p.metadata.namespace}/{p.metadata.name} ({reasons[0] if reasons else 'not yet scheduled'})")
    return sorted(found)


def operand_placement_problems(api: ApiClient, namespace: str, fenced: Iterable[str],
                               operator_min_version: Optional[str] = None) -> list[str]:
    """Driver, device plugin, container toolkit or DCGM exporter pods on a node that must keep IBM's drivers: what
    the runbook checks by hand after installing the operator.

    `fenced` names the nodes as they were fenced; a replaced worker's fence stays in state under the old name, and a
    new worker can get that name again (VPC subnets hand out freed IPs, and IKS names nodes by IP). A node of that
    name whose kubelet is at `operator_min_version` or later is such a new worker: no IBM drivers, nothing to check."""
    from .versions import version_at_least  # noqa: PLC0415
    fenced = set(fenced)
    per_node: dict[str, list[str]] = {}
    for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items:
        node = p.spec.node_name
        if node in fenced and any(_operand(p, o) for o in FENCED_OPERANDS):
            per_node.setdefault(node, []).append(f"{namespace}/{p.metadata.name}")
    if operator_min_version and per_node:
        kubelets = {n.metadata.name: (n.status.node_info.kubelet_version if n.status and n.status.node_info else None)
                    for n in client.CoreV1Api(api).list_node().items}
        per_node = {n: pods for n, pods in per_node.items()
                    if not version_at_least(kubelets.get(n), operator_min_version)}
    return [f"node {n}: runs IBM-managed drivers but has GPU Operator pods {', '.join(sorted(pods))}; the "
            "operator must not run there (check its nvidia.com/gpu.deploy.operands=false label)"
            for n, pods in sorted(per_node.items())]


@dataclass
class SmokeResult:
    problems: list[str] = field(default_factory=list)
    gpu_uuid: str = ""
    device: str = ""  # <driver>/<pool>/<device>
    claim: str = ""  # namespace/name of the ResourceClaim generated for the pod
    claim_uid: str = ""


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


def capture_claim(api: ApiClient, pod: client.V1Pod, claims: dict[str, Any]) -> None:
    """Keep the pod's extended-resource claim (by name) the first time it can be read."""
    status = pod.status.extended_resource_claim_status if pod.status else None
    if not status or status.resource_claim_name in claims:
        return
    try:
        claims[status.resource_claim_name] = client.ResourceV1Api(api).read_namespaced_resource_claim(
            status.resource_claim_name, pod.metadata.namespace)
    except ApiException as e:
        if e.status != 404:
            raise


def allocation(api: ApiClient, pod: client.V1Pod, driver: str, extended_resource: str, result: SmokeResult,
               claims: Optional[dict[str, Any]] = None) -> None:
    """Fill result.claim/device from the pod's DRA extended-resource claim, or add a criterion-2 problem.
    `claims`: claims read while the pod ran (the resourceclaim controller deletes a finished pod's claim)."""
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
    claims = {} if claims is None else claims
    capture_claim(api, pod, claims)
    claim = claims.get(status.resource_claim_name)
    if claim is None:
        result.problems.append(
            f"criterion 2 (allocation): ResourceClaim {result.claim} was deleted before it could be read (the "
            f"resourceclaim controller removes a finished pod's claim); make gpu-migration:smokeTest.command hold "
            f"the GPU longer than timeouts.pollInterval, e.g. end it with `&& sleep 60`")
        return
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
    result.claim_uid = claim.metadata.uid or ""


def prepared_claim(log: str, claim_uid: str) -> bool:
    """The kubelet plugin logged that it prepared the claim (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/driver.go,
    level 0): v25.8 `...for claim '<uid>': ...`, v25.12 `...for claim '<namespace>/<name>:<uid>': ...`."""
    return bool(re.search(rf"Returning newly prepared devices for claim '(?:[^']*:)?{re.escape(claim_uid)}'", log))


def allocation_logged(api: ApiClient, dra_namespace: str, node: str, result: SmokeResult) -> None:
    """Criterion 2: the DRA driver on the node logged an allocation for the pod's claim."""
    plugins = kubelet_plugin_pods(api, dra_namespace, node)
    if not plugins:
        result.problems.append(f"criterion 2 (allocation): no DRA kubelet plugin pod on node {node} in namespace "
                               f"{dra_namespace}")
        return
    core = client.CoreV1Api(api)
    for pod in plugins:
        try:
            log = core.read_namespaced_pod_log(pod.metadata.name, dra_namespace, container=KUBELET_PLUGIN_CONTAINER)
        except ApiException as e:
            if e.status in (400, 404):
                continue
            raise
        if prepared_claim(log or "", result.claim_uid):
            return
    names = ", ".join(f"{dra_namespace}/{p.metadata.name}" for p in plugins)
    result.problems.append(f"criterion 2 (allocation): DRA kubelet plugin {names} logged no prepared devices for "
                           f"claim {result.claim} (uid {result.claim_uid})")


def uuid_problem(seen: list[str], allocated: str) -> str:
    """'' if the container saw exactly the allocated device. `nvidia-smi -L` prints a MIG device under its parent
    GPU's line, so with a MIG device the parent's GPU- UUID is expected next to the MIG- one; the allocated uuid must
    be among the printed ones, and no other device of its kind."""
    if allocated not in seen:
        return f"allocated uuid {allocated} not printed"
    kind = allocated.split("-", 1)[0]
    others = [u for u in seen if u.split("-", 1)[0] == kind and u != allocated]
    return f"other {kind} devices visible: {others}" if others else ""


def verify_smoke(
    api: ApiClient, namespace: str, pod_name: str, node: str, driver: str, extended_resource: str,
    dra_namespace: Optional[str] = None, claims: Optional[dict[str, Any]] = None,
) -> SmokeResult:
    """The four smoke-test criteria for a finished pod; each problem says which criterion failed and what was seen.
    With `dra_namespace`, criterion 2 also needs the DRA kubelet plugin's log line for the pod's claim."""
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(pod_name, namespace)
    name = f"{namespace}/{pod_name}"
    result = SmokeResult(problems=scheduling_problems(api, pod, node))
    allocation(api, pod, driver, extended_resource, result, claims)
    if dra_namespace and result.claim_uid:
        allocation_logged(api, dra_namespace, node, result)

    # (3) the GPU the container saw is the one DRA allocated.
    log = pod_log(api, pod)
    seen = logged_uuids(log)
    if not seen:
        result.problems.append(f"criterion 3 (GPU in logs): pod {name} logs name no GPU UUID; logs: {log[-300:]!r}")
    elif result.device and not result.gpu_uuid:
        result.problems.append(
            f"criterion 3 (GPU in logs): allocated device {result.device} has no uuid attribute in its ResourceSlice"
        )
    elif result.gpu_uuid and (why := uuid_problem(seen, result.gpu_uuid)):
        result.problems.append(
            f"criterion 3 (GPU in logs): pod {name} logs name {seen}, allocated device {result.device} "
            f"is {result.gpu_uuid} ({why})"
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


# --- GPU nodes discovered from the cluster ----------------------------------------------------------------------------

# IKS labels every worker node with its flavor and worker ID (read back by IBM's cloud provider:
# IBM-Cloud/cloud-provider-ibm ibm/ibm_metadata_service.go, machineTypeLabel / workerIDLabel) and its worker pool
# (ibm-cloud.kubernetes.io/worker-pool-name, IBM Cloud docs "Adding labels and taints to worker nodes"). IKS GPU
# flavors are the gx families (e.g. gx3.16x80.l4, gx2.16x128.2v100).
IKS_FLAVOR_LABEL = "ibm-cloud.kubernetes.io/machine-type"
IKS_WORKER_ID_LABEL = "ibm-cloud.kubernetes.io/worker-id"
IKS_POOL_LABEL = "ibm-cloud.kubernetes.io/worker-pool-name"
IKS_ZONE_LABEL = "ibm-cloud.kubernetes.io/zone"
ZONE_LABEL = "topology.kubernetes.io/zone"  # well-known label (kubernetes.io/docs/reference/labels-annotations-taints)
GPU_FLAVOR_PREFIXES = ("gx",)
# Set by OperatorReadiness on a replaced node: the config entry it belongs to (its name may differ).
CONFIG_NAME_ANNOTATION = "migration.example.com/gpu-node"


def is_gpu_node(node: client.V1Node) -> bool:
    """nvidia.com/gpu capacity (IBM's or the operator's device plugin), GFD's gpu.present label, or a GPU flavor."""
    labels = node.metadata.labels or {}
    capacity = {**((node.status and node.status.capacity) or {}), **((node.status and node.status.allocatable) or {})}
    return (
        GPU_RESOURCE in capacity
        or labels.get("nvidia.com/gpu.present") == "true"
        or labels.get(IKS_FLAVOR_LABEL, "").startswith(GPU_FLAVOR_PREFIXES)
    )


@dataclass
class Inventory:
    problems: list[str]
    warnings: list[str]
    # config name -> {"pool", "zone"} of its node, from this run and every earlier one (kept in the check's state):
    # the evidence that lets a later run tell "its worker is being replaced" from "this name is wrong".
    seen: dict[str, dict[str, str]]


def _place(labels: dict[str, str]) -> dict[str, str]:
    return {"pool": labels.get(IKS_POOL_LABEL, ""), "zone": labels.get(ZONE_LABEL) or labels.get(IKS_ZONE_LABEL, "")}


def inventory(
    api: ApiClient, configured: dict[str, str], worker_ids: dict[str, str], operator_min_version: str,
    temp_pool: Optional[str] = None, seen: Optional[dict[str, dict[str, str]]] = None,
) -> Inventory:
    """Compares the cluster's GPU nodes with gpu-migration:nodes (`configured`: name -> stage, `worker_ids`: worker
    ID -> config name); `seen`: the pool and zone of each entry's node as earlier runs found them.

    Every GPU node must belong to an entry (by name, IKS worker ID, or the annotation OperatorReadiness sets on a
    replaced node), and every entry must have a node. Two cases are explained by a replacement this program started
    and an interruption cut short, and so only warn: an entry past `ibm-managed` whose node an earlier run saw but is
    gone now (its worker is being replaced), paired one-to-one with an unlisted GPU node at or past
    operator_min_version in the same worker pool and zone (its new worker, not yet tied to the entry). Everything
    else is a problem that names the node: an unlisted GPU node on IBM's drivers (it would get the GPU Operator next
    to them), any other unlisted GPU node, an `ibm-managed` entry with no node (its node would stay unfenced), and an
    entry with no node that no run ever saw (a wrong name)."""
    from .versions import version_at_least  # noqa: PLC0415
    seen = dict(seen or {})
    problems, warnings = [], []
    unlisted: list[client.V1Node] = []
    now: dict[str, dict[str, str]] = {}
    for n in client.CoreV1Api(api).list_node().items:
        labels, annotations = n.metadata.labels or {}, n.metadata.annotations or {}
        name = n.metadata.name
        owner = (name if name in configured else worker_ids.get(labels.get(IKS_WORKER_ID_LABEL, ""))
                 or (annotations.get(CONFIG_NAME_ANNOTATION) if annotations.get(CONFIG_NAME_ANNOTATION) in configured
                     else None))
        if (owner and owner != name and worker_ids.get(labels.get(IKS_WORKER_ID_LABEL, "")) == owner
                and annotations.get(CONFIG_NAME_ANNOTATION) != owner):
            # The entry's worker runs under another name and is no replacement this program tied to the entry:
            # a wrong name, and fences and labels would miss the node.
            problems.append(f"node {owner} in gpu-migration:nodes has workerId {labels.get(IKS_WORKER_ID_LABEL)}, "
                            f"whose node is {name}; set its name to {name}")
        if owner:
            now.setdefault(owner, _place(labels))
        elif is_gpu_node(n) and not (temp_pool and labels.get(IKS_POOL_LABEL) == temp_pool):
            unlisted.append(n)
    # Entries whose node is gone after an earlier run saw it: their worker is being replaced.
    in_replacement = {name: seen[name] for name, stage in configured.items()
                      if name not in now and stage != "ibm-managed" and name in seen}
    for n in unlisted:
        labels, name = n.metadata.labels or {}, n.metadata.name
        kubelet = n.status.node_info.kubelet_version if n.status and n.status.node_info else None
        place = _place(labels)
        what = (f"GPU node {name} (kubelet {kubelet}, flavor {labels.get(IKS_FLAVOR_LABEL, '?')}, worker pool "
                f"{place['pool'] or '?'}, zone {place['zone'] or '?'}) is not listed in gpu-migration:nodes")
        add = f"{{name: {name}, workerId: {labels.get(IKS_WORKER_ID_LABEL, '?')}, stage: ...}}"
        if not version_at_least(kubelet, operator_min_version):
            problems.append(f"{what}: it runs IBM-managed drivers and would get the GPU Operator next to them; add "
                            f"it with stage ibm-managed ({add})")
            continue
        replaced = next((entry for entry, p in in_replacement.items() if p == place), None)
        if replaced is None:
            problems.append(f"{what}, and it is not the new worker of a listed node whose replacement is under way "
                            f"(none in that pool and zone); add it with its stage ({add}), or remove it from the "
                            "cluster")
            continue
        del in_replacement[replaced]
        now[replaced] = place
        warnings.append(f"{what}; taken for the new worker of {replaced} (same pool and zone, whose node is gone): "
                        f"the resumed replacement of {replaced} records it")
    for name, stage in configured.items():
        if name in now:
            continue
        if stage == "ibm-managed":
            problems.append(f"node {name} in gpu-migration:nodes (stage ibm-managed) matches no node in the "
                            "cluster; fix its name (`kubectl get nodes`)")
        elif name in in_replacement:
            warnings.append(f"node {name} in gpu-migration:nodes (stage {stage}) is gone since an earlier run saw it "
                            "and no new worker has joined yet: its replacement resumes")
        else:
            problems.append(f"node {name} in gpu-migration:nodes (stage {stage}) matches no node in the cluster and "
                            "no earlier run saw it; fix its name (`kubectl get nodes`)")
    return Inventory(problems, warnings, {**seen, **now})


def workers_of_other_entries(api: ApiClient, own: Optional[str]) -> dict[str, str]:
    """Worker ID -> config entry, for every node that OperatorReadiness tied to an entry other than `own`
    (CONFIG_NAME_ANNOTATION, on the node IKS labels with its worker ID). Durable across provider processes, so a
    replacement resumed by a later `pulumi up` never follows a worker another entry already recorded."""
    out: dict[str, str] = {}
    for n in client.CoreV1Api(api).list_node(label_selector=IKS_WORKER_ID_LABEL).items:
        labels, annotations = n.metadata.labels or {}, n.metadata.annotations or {}
        entry = annotations.get(CONFIG_NAME_ANNOTATION)
        if entry and entry != own and labels.get(IKS_WORKER_ID_LABEL):
            out[labels[IKS_WORKER_ID_LABEL]] = entry
    return out
