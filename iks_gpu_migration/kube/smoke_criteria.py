"""The four smoke-test criteria, judged on a finished pod: scheduled on its node, allocated through DRA (claim and the
kubelet plugin's log), the allocated GPU is the one the container saw, and the GPU operation succeeded."""
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from .cluster import KUBELET_PLUGIN_CONTAINER, kubelet_plugin_pods, logged_uuids, pod_log, slices


@dataclass
class SmokeResult:
    problems: list[str] = field(default_factory=list)
    gpu_uuid: str = ""
    device: str = ""  # <driver>/<pool>/<device>
    claim: str = ""  # namespace/name of the ResourceClaim generated for the pod
    claim_uid: str = ""


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
    watched = claims is not None
    claims = {} if claims is None else claims
    capture_claim(api, pod, claims)
    claim = claims.get(status.resource_claim_name)
    if claim is None:
        # Only a pod watched while it ran (`claims` given: SmokeTestVerification re-runs a pod that had ended before
        # it looked) says the command was too short; else nothing this run saw tells why the claim is gone.
        advice = ("; the pod ended between two readings: make gpu-migration:smokeTest.command hold the GPU longer "
                  "than timeouts.pollInterval, e.g. end it with `&& sleep 60`" if watched else
                  "; the pod had ended before it was judged: run `pulumi up` again, it runs the pod again")
        result.problems.append(
            f"criterion 2 (allocation): ResourceClaim {result.claim} was deleted before it could be read (the "
            f"resourceclaim controller removes a finished pod's claim){advice}")
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
