"""Move a node's workloads off it before IKS replaces its worker (the runbook: "Migrieren Sie Ihre GPU-Workloads auf
den temporären Arbeiterknoten").

As `kubectl drain` does (kubernetes/kubectl pkg/drain/{drain,filters}.go): cordon the node, then evict every pod on
it through the Eviction API (policy/v1), which honours PodDisruptionBudgets: 429 Too Many Requests means the budget
allows no disruption right now (kubernetes pkg/registry/core/pod/storage/eviction.go), so the eviction is retried
until the bounded timeout. DaemonSet pods and mirror (static) pods are skipped: their controllers keep them on the
node anyway. Finished pods need no eviction.

When the workloads are to go to other GPU nodes (the temporary pool), those nodes must offer GPUs before the node is
drained, or GPU pods would just wait Pending.

Called by WorkerReplacementProvider right before each replaceWorker, so it runs exactly when a replacement does
(also on a kubeVersion bump), never for a node already at its target.
"""
import json
from typing import Any, Optional

import pulumi
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..common.waiting import WaitTimeout, optional_float, wait_for

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # static pods (kubectl drain filters.go skips them too)
DEFAULT_GPU_RESOURCES = ("nvidia.com/gpu",)


class EvictionError(RuntimeError):
    """The node could not be emptied in time; nothing was replaced."""


def skip_reason(pod: client.V1Pod) -> Optional[str]:
    """Why a pod is left alone (None: evict it)."""
    meta = pod.metadata
    if any(ref.kind == "DaemonSet" for ref in meta.owner_references or []):
        return "DaemonSet pod"
    if MIRROR_ANNOTATION in (meta.annotations or {}):
        return "mirror pod"
    if (pod.status.phase if pod.status else None) in ("Succeeded", "Failed"):
        return "finished"
    return None


def to_evict(pods: list[client.V1Pod]) -> list[client.V1Pod]:
    return [p for p in pods if skip_reason(p) is None]


def gpus_offered(node: client.V1Node, resources: list[str]) -> int:
    allocatable = (node.status.allocatable if node.status else None) or {}
    total = 0
    for resource in resources:
        try:
            total += int(allocatable.get(resource) or 0)
        except ValueError:
            pass
    return total


def _settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "kubeconfig": settings.get("kubeconfig") or None,
        "timeout": optional_float(settings.get("timeout"), 1800),
        "interval": optional_float(settings.get("poll_interval"), 15),
        "gpu_nodes": [n for n in settings.get("gpu_nodes") or [] if n],
        "gpu_resources": list(settings.get("gpu_resources") or DEFAULT_GPU_RESOURCES),
    }


def drain(node: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Cordon `node` and evict its pods; returns {"evicted": [...], "skipped": [...]}. Raises EvictionError on
    timeout, naming the pods left and what blocks them (the node stays cordoned; nothing was replaced)."""
    s = _settings(settings)
    with config.new_client_from_config(config_file=s["kubeconfig"]) as api:
        core = client.CoreV1Api(api)
        try:
            core.read_node(node)
        except ApiException as e:
            if e.status == 404:
                pulumi.log.info(f"node {node} is not in the cluster (its worker is already going): nothing to drain")
                return {"evicted": [], "skipped": []}
            raise
        if s["gpu_nodes"]:
            _wait_for_gpus(core, s)
        pulumi.log.info(f"cordoning node {node} and evicting its pods before its worker is replaced")
        core.patch_node(node, {"spec": {"unschedulable": True}})
        return _evict_all(core, node, s)


def _wait_for_gpus(core: client.CoreV1Api, s: dict[str, Any]) -> None:
    def poll() -> tuple[bool, None, str]:
        missing = []
        for name in s["gpu_nodes"]:
            try:
                offered = gpus_offered(core.read_node(name), s["gpu_resources"])
            except ApiException as e:
                if e.status != 404:
                    raise
                offered = -1
            if offered <= 0:
                missing.append(f"{name}: " + ("not registered" if offered < 0 else "no GPUs allocatable"))
        return not missing, None, "; ".join(missing)

    what = (f"GPUs on the nodes that take the workloads ({', '.join(s['gpu_nodes'])}; resources "
            f"{', '.join(s['gpu_resources'])})")
    try:
        wait_for(what, poll, s["timeout"], s["interval"])
    except WaitTimeout as e:
        raise EvictionError(f"{e}; nothing was drained or replaced: the GPU workloads would have nowhere to run. "
                            f"Check the GPU Operator on those nodes and re-run `pulumi up`") from None


def _evict_all(core: client.CoreV1Api, node: str, s: dict[str, Any]) -> dict[str, Any]:
    evicted: set[str] = set()
    skipped: set[str] = set()
    blocked: dict[str, str] = {}

    def poll() -> tuple[bool, None, str]:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        for pod in pods:
            key = f"{pod.metadata.namespace}/{pod.metadata.name}"
            reason = skip_reason(pod)
            if reason:
                skipped.add(f"{key} ({reason})")
                continue
            blocked.pop(key, None)
            try:
                body = client.V1Eviction(  # typed as kubectl drain sends it (policy/v1 Eviction)
                    api_version="policy/v1", kind="Eviction",
                    metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace))
                core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body)
                evicted.add(key)
            except ApiException as e:
                if e.status == 404:
                    continue  # already gone
                if e.status == 429:  # a PodDisruptionBudget allows no disruption now: retry later
                    blocked[key] = f"PodDisruptionBudget: {_message(e)}"
                    continue
                raise EvictionError(f"evicting pod {key} from node {node} failed: HTTP {e.status}: {_message(e)}; "
                                    f"node {node} is left cordoned and its worker was not replaced") from None
        left = to_evict(pods)
        names = [f"{p.metadata.namespace}/{p.metadata.name}" for p in left]
        state = "; ".join(f"{n}" + (f" ({blocked[n]})" if n in blocked else " (terminating)") for n in names)
        return not left, None, state or "empty"

    try:
        # The first poll evicts; later polls retry blocked evictions and wait for evicted pods to be gone.
        wait_for(f"pods evicted from node {node}", poll, s["timeout"], s["interval"])
    except WaitTimeout as e:
        raise EvictionError(
            f"{e}; node {node} is left cordoned and its worker was not replaced. Let the blocking "
            f"PodDisruptionBudgets allow a disruption (scale up, or move the pods), then re-run `pulumi up`; "
            f"to give up instead: `kubectl uncordon {node}`"
        ) from None
    if skipped:
        pulumi.log.info(f"node {node}: left in place: {', '.join(sorted(skipped))}")
    return {"evicted": sorted(evicted), "skipped": sorted(skipped)}


def _message(e: ApiException) -> str:
    try:
        return json.loads(e.body).get("message") or str(e.reason)
    except Exception:  # noqa: BLE001 - a non-JSON body keeps the reason phrase
        return str(e.reason)
