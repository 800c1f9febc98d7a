"""A node's pods as the drain decides on them (plan/drain.py): read from the cluster into views, the DaemonSets that
still exist, and the optional wait for jobs to finish (the GPU Operator's `waitForCompletion`)."""
from datetime import datetime, timezone
from typing import Any

import pulumi
from kubernetes import client

from ..common.waiting import WaitTimeout, wait_for
from ..plan.drain import DrainList, DrainOptions, PodView, pods_for_deletion
from .cluster import raw_items

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # static pods (kubectl drain filters.go mirrorPodFilter)


def uses_gpu(pod: client.V1Pod, resources: list[str]) -> bool:
    """A container or init container requests or limits one of the GPU resources (as the GPU Operator's
    gpuPodDeletion finds GPU pods: k8s-operator-libs upgrade/pod_manager.go, by resource name)."""
    containers = list(pod.spec.containers or []) + list(pod.spec.init_containers or [])
    for c in containers:
        res = c.resources
        if res and any(r in (res.requests or {}) or r in (res.limits or {}) for r in resources):
            return True
    return False


def view(pod: client.V1Pod, resources: list[str], now: datetime) -> PodView:
    meta, spec = pod.metadata, pod.spec
    ref = next((r for r in meta.owner_references or [] if r.controller), None)
    deleted = meta.deletion_timestamp
    return PodView(
        namespace=meta.namespace, name=meta.name, uid=meta.uid or "",
        phase=(pod.status.phase if pod.status else None) or "Pending",
        controller=(ref.kind, ref.name) if ref else None, controller_api=ref.api_version if ref else "",
        mirror=MIRROR_ANNOTATION in (meta.annotations or {}),
        empty_dirs=tuple(v.name for v in spec.volumes or [] if v.empty_dir is not None),
        terminating_for=(now - deleted).total_seconds() if deleted else None,
        uses_gpu=uses_gpu(pod, resources),
        labels=dict(meta.labels or {}),
    )


def node_pods(core: client.CoreV1Api, node: str) -> list[client.V1Pod]:
    return core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items


def listing(api, node: str, opts: DrainOptions, resources: list[str]) -> DrainList:
    """GetPodsForDeletion: every pod of the node judged before anything is evicted."""
    pods = [view(p, resources, datetime.now(timezone.utc)) for p in node_pods(client.CoreV1Api(api), node)]
    return pods_for_deletion(pods, _daemonsets(api, pods), opts)


def _daemonsets(api, pods: list[PodView]) -> set[tuple[str, str]]:
    """The controlling DaemonSets that exist (read per namespace: a drain needs no cluster-wide list of them), as
    plain JSON (cluster.raw_items): only their names are read, and a batch's drains read the GPU Operator's large
    DaemonSets at once."""
    apps, found = client.AppsV1Api(api), set()
    for ns in sorted({p.namespace for p in pods if (p.controller or ("",))[0] == "DaemonSet"}):
        found |= {(ns, d["metadata"]["name"]) for d in raw_items(apps.list_namespaced_daemon_set(
            ns, _preload_content=False))}
    return found


def wait_for_completion(core: client.CoreV1Api, node: str, spec: dict[str, Any], interval: float) -> None:
    """Pods on the node matching `pod_selector` finish (or go) before anything is evicted. As the operator's upgrade
    policy (k8s-operator-libs upgrade: wait-for-jobs-required -> pod-deletion-required once timeoutSeconds passed),
    the drain then goes on and evicts what still runs, with a warning naming it."""
    selector, timeout = spec["pod_selector"], float(spec.get("timeout") or 3600)

    def poll() -> tuple[bool, None, str]:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", label_selector=selector).items
        running = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods
                   if (p.status.phase if p.status else None) not in ("Succeeded", "Failed")]
        return not running, None, f"still running: {', '.join(running)}" if running else "all finished"

    try:
        wait_for(f"pods matching {selector} on node {node} to finish (drain.waitForCompletion)", poll, timeout,
                 interval)
    except WaitTimeout as e:
        pulumi.log.warn(f"{e}; the drain goes on and evicts them (as the GPU Operator's waitForCompletion does)")
