"""Move a node's workloads off it before IKS replaces its worker, as `kubectl drain` does (k8s.io/kubectl/pkg/drain
drain.go, filters.go at v0.37.2), with its options in the stack config (`drain:`, plan/drain.py decides):

1. with a temporary pool, its nodes offer GPUs first (or GPU pods would just wait Pending);
2. cordon, marked as this program's (kube/cordon.py), undone whenever the run stops before the replacement;
3. optionally wait for jobs (drain.waitForCompletion), then list what would go (GetPodsForDeletion): bare pods and
   pods with emptyDir data are refused unless opted in, naming every one, and nothing is evicted;
4. evict through the Eviction API (policy/v1) once per pod: a 429 is a PodDisruptionBudget (named, with its allowed
   disruptions) or throttling (Retry-After honoured); a 403 in a terminating namespace is retried (drain.go
   evictPods); finished pods are deleted;
5. wait for the evicted pods by UID (waitForDelete), not for an empty node; a pod that came back is named, not
   awaited; on a NotReady node or past drain.skipWaitForDeleteTimeout a terminating pod is not awaited either
   (its kubelet will not finish it; the worker is deleted anyway).
Everything is bounded by timeouts.evict; what went is logged per pod and recorded on the node (records.py).

Called by WorkerReplacementProvider right before each replaceWorker, so it runs exactly when a replacement does.
"""
import dataclasses
import json
import time
from typing import Any, Optional

import pulumi
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..common.waiting import WaitTimeout, optional_float, wait_for, waking_with
from ..plan.drain import DrainList, DrainOptions, Verdict, namespace_terminating, too_many
from . import drain_listing
from .clients import api_client, shared_client
from .cordon import CORDON_ANNOTATION
from .node_changes import woken_by_changes
from .provider import _short
from .refusals import fix
from .records import DRAIN_ANNOTATION, record_drain

DEFAULT_GPU_RESOURCES = ("nvidia.com/gpu",)
DRAIN_CORDON = "worker-replacement"  # CORDON_ANNOTATION value of the drain's cordon


class EvictionError(RuntimeError):
    """The node could not be emptied; nothing was replaced."""


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
    opts = settings.get("drain") or {}
    return {
        "kubeconfig": settings.get("kubeconfig") or None,
        "timeout": optional_float(settings.get("timeout"), 1800),
        "interval": optional_float(settings.get("poll_interval"), 15),
        "gpu_nodes": [n for n in settings.get("gpu_nodes") or [] if n],
        "gpu_resources": list(settings.get("gpu_resources") or DEFAULT_GPU_RESOURCES),
        "options": DrainOptions(force=bool(opts.get("force")),
                                delete_empty_dir_data=bool(opts.get("delete_empty_dir_data")),
                                skip_wait_for_delete_timeout=float(opts.get("skip_wait_for_delete_timeout") or 0),
                                gpu_pods_only=bool(opts.get("gpu_pods_only"))),
        "wait_for_completion": opts.get("wait_for_completion") or None,
    }


def drain(node: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Cordon `node` and move its pods off; returns what went ({"evicted", "deleted", "skipped", "notAwaited",
    "cameBack"}). Raises EvictionError naming the pods and what blocks them; the node is then uncordoned again
    if this drain cordoned it, and nothing was replaced."""
    s = _settings(settings)
    with api_client(s["kubeconfig"]) as api:
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
        pulumi.log.info(f"cordoning node {node} and draining it before its worker is replaced")
        _cordon(api, node)
        try:  # its waits (jobs to finish, evicted pods gone) wake on each change to the node's pods
            with woken_by_changes(s["kubeconfig"], node) as sleep, waking_with(sleep):
                result = _Drain(api, node, s).run()
        except BaseException:
            _undo_cordon_quietly(api, node)
            raise
    return result


def evict_for_switch(api, node: str, pods: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    """drain.switchGpuPods: evict. The dra switch's GPU pods `pods` (namespace/name: those it would wait for) evicted
    under the drain's rules as a drain evicts them (PodDisruptionBudgets respected, bare pods and emptyDir data only
    if opted in, DaemonSet pods left), then awaited until gone, bounded by settings["timeout"] (timeouts.drain). The
    switch cordoned the node already; the node keeps every other pod and no drain is recorded on it."""
    s = _settings(settings)
    s.update(options=dataclasses.replace(s["options"], gpu_pods_only=False),  # `pods` are the GPU pods already
             not_done="its GPU path was not switched", bound="gpu-migration:timeouts.drain")
    return _Drain(api, node, s, only=set(pods)).run()


def _cordon(api, node: str) -> None:
    """Cordon marked as the drain's. A node already cordoned by anyone else (an admin, the path switch holding an
    unverified node back) keeps that cordon and its mark: only a cordon the drain set is ever undone."""
    core = client.CoreV1Api(api)
    current = core.read_node(node)
    mark = (current.metadata.annotations or {}).get(CORDON_ANNOTATION)
    if current.spec.unschedulable and mark != DRAIN_CORDON:
        return
    core.patch_node(node, {"metadata": {"annotations": {CORDON_ANNOTATION: DRAIN_CORDON}},
                           "spec": {"unschedulable": True}})


def release(node: str, settings: dict[str, Any]) -> bool:
    """The replacement did not happen after all (refused, or the run stopped before its request): undo the drain's
    cordon. True if undone; never raises (the error that stopped the run is the one to show)."""
    try:
        api = shared_client(_settings(settings)["kubeconfig"])
    except Exception as e:  # noqa: BLE001 - as in _undo_cordon_quietly
        pulumi.log.warn(f"node {node}: the drain's cordon could not be checked ({e}); `kubectl uncordon {node}` if "
                        f"it is cordoned and its worker is not to be replaced")
        return False
    return _undo_cordon_quietly(api, node)


def recorded(node: str, settings: dict[str, Any]) -> Optional[dict]:
    """The drain recorded on `node` (records.py DRAIN_ANNOTATION), for a replacement resumed after its request;
    None if the node or the record is gone. Never raises."""
    try:
        with api_client(_settings(settings)["kubeconfig"]) as api:
            raw = (client.CoreV1Api(api).read_node(node).metadata.annotations or {}).get(DRAIN_ANNOTATION)
        return json.loads(raw) if raw else None
    except Exception:  # noqa: BLE001 - a missing record only leaves `status` without it
        return None


def _undo_cordon_quietly(api, node: str) -> bool:
    try:
        undone = _undo_cordon(api, node)
    except Exception as e:  # noqa: BLE001 - secondary to the error that stopped the drain or replacement
        if not (isinstance(e, ApiException) and e.status == 404):
            pulumi.log.warn(f"node {node}: the drain's cordon could not be undone ({e.__class__.__name__}: "
                            f"{_short(e)}); `kubectl uncordon {node}` if its worker is not to be replaced")
        return False
    if undone:
        pulumi.log.info(f"node {node}: the drain's cordon was undone (its worker was not replaced)")
    return undone


def _undo_cordon(api, node: str) -> bool:
    """Only the drain's own cordon (_cordon): an admin's cordon, or the path switch's, stays."""
    core = client.CoreV1Api(api)
    if (core.read_node(node).metadata.annotations or {}).get(CORDON_ANNOTATION) != DRAIN_CORDON:
        return False
    core.patch_node(node, {"metadata": {"annotations": {CORDON_ANNOTATION: None}}, "spec": {"unschedulable": None}})
    return True


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


class _Drain:
    """One drain of one node within this process: what was listed, evicted, awaited."""

    def __init__(self, api, node: str, s: dict[str, Any], only: Optional[set[str]] = None) -> None:
        self.api, self.node, self.s = api, node, s
        self.only = only  # evict_for_switch: these pods (namespace/name) alone, and no record on the node
        self.not_done = s.get("not_done", "its worker was not replaced")
        self.core = client.CoreV1Api(api)
        self.to_evict: dict[str, Verdict] = {}
        self.not_before: dict[str, float] = {}  # no eviction POST before (Retry-After, PDB backoff)
        self.blocked: dict[str, str] = {}
        self.awaited: dict[str, str] = {}  # pod key -> UID evicted or deleted
        self.gone: list[str] = []
        self.evicted: list[str] = []
        self.not_awaited: list[str] = []

    def run(self) -> dict[str, Any]:
        if self.s["wait_for_completion"]:
            drain_listing.wait_for_completion(self.core, self.node, self.s["wait_for_completion"], self.s["interval"])
        listed = self._listing()
        if listed.refused:
            raise EvictionError(f"{listed.refusal(self.node)} (gpu-migration:drain); node {self.node} keeps running "
                                f"them and {self.not_done}")
        deleted = [self._delete(v) for v in listed.with_action("delete")]
        self.to_evict = {v.pod.key: v for v in listed.with_action("evict")}
        # Deleted pods are awaited too (kubectl drain deletePods -> waitForDelete): a Job's pod goes only once the
        # job controller removed its tracking finalizer.
        self.awaited.update({v.pod.key: v.pod.uid for v in listed.with_action("await") + listed.with_action("delete")})
        try:
            wait_for(f"pods evicted from node {self.node}", self._poll, self.s["timeout"], self.s["interval"])
        except WaitTimeout as e:
            raise EvictionError(self._timeout_message(e)) from None
        result = {
            "evicted": sorted(self.evicted), "deleted": sorted(deleted),
            "skipped": sorted(f"{v.pod.key} ({v.reason})" for v in listed.with_action("skip")),
            "notAwaited": sorted(self.not_awaited), "cameBack": self._came_back(listed),
        }
        self._report(result)
        return result

    def _listing(self) -> DrainList:
        listed = drain_listing.listing(self.api, self.node, self.s["options"], self.s["gpu_resources"])
        if self.only is None:
            return listed
        return DrainList([v for v in listed.verdicts if v.pod.key in self.only],
                         [v for v in listed.refused if v.pod.key in self.only])

    def _delete(self, verdict: Verdict) -> str:
        """Finished pods are deleted (kubectl drain deletes them too; no disruption to budget for)."""
        pod = verdict.pod
        try:
            only_this = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid))
            self.core.delete_namespaced_pod(pod.name, pod.namespace, body=only_this)
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or another pod of that name now
                raise
        pulumi.log.info(f"node {self.node}: deleted finished pod {pod.key}")
        return pod.key

    def _poll(self) -> tuple[bool, None, str]:
        now = time.monotonic()
        for key, verdict in list(self.to_evict.items()):
            if self.not_before.get(key, 0) <= now:
                self._evict(key, verdict, now)
        self._check_awaited()
        waiting = [f"{k} ({self.blocked.get(k, 'eviction not accepted yet')})" for k in self.to_evict] + \
            [f"{k} (terminating)" for k in self.awaited]
        done = not self.to_evict and not self.awaited
        return done, None, f"{len(self.gone)} gone; left: {'; '.join(waiting)}" if waiting else "all gone"

    def _evict(self, key: str, verdict: Verdict, now: float) -> None:
        pod = verdict.pod
        body = client.V1Eviction(api_version="policy/v1", kind="Eviction",  # as kubectl drain sends it
                                 metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
        except ApiException as e:
            self._refused(key, e, now)
            return
        del self.to_evict[key]
        self.blocked.pop(key, None)
        self.awaited[key] = pod.uid
        self.evicted.append(key)
        pulumi.log.info(f"node {self.node}: evicted pod {key}" + (f" ({verdict.reason})" if verdict.reason else ""))

    def _refused(self, key: str, e: ApiException, now: float) -> None:
        status = _status(e)
        if e.status == 404:  # already gone
            del self.to_evict[key]
            self.gone.append(key)
        elif e.status == 429:
            answer = too_many(status, (e.headers or {}).get("Retry-After"))
            if answer.budget:
                self.blocked[key] = self._budget(key.split("/")[0], answer.budget, answer.message)
            else:
                self.blocked[key] = (f"API server throttling (429 without a PodDisruptionBudget cause"
                                     f"{f', Retry-After {answer.retry_after:g}s' if answer.retry_after else ''})")
                pulumi.log.info(f"node {self.node}: evicting pod {key}: {self.blocked[key]}; retrying")
            self.not_before[key] = now + answer.retry_after
        elif e.status == 403 and namespace_terminating(status):
            self._in_terminating_namespace(key)
        else:
            raise EvictionError(f"evicting pod {key} from node {self.node} failed: HTTP {e.status}: "
                                f"{status.get('message') or e.reason}; {self.not_done}. "
                                f"{_fix_for(e.status, status)}") from None

    def _in_terminating_namespace(self, key: str) -> None:
        """The namespace controller deletes the pod itself: once it is terminating (or gone) it is awaited like an
        evicted one; until then the eviction is retried (kubectl drain.go evictPods)."""
        pod = self._read(key)
        if pod is None or pod.metadata.deletion_timestamp:
            uid = self.to_evict.pop(key).pod.uid
            self.blocked.pop(key, None)
            if pod is None:
                self.gone.append(key)
            else:
                self.awaited[key] = uid
            return
        self.blocked[key] = "its namespace is terminating; the namespace controller deletes it (retried)"

    def _budget(self, namespace: str, name: str, message: str) -> str:
        try:
            pdb = client.PolicyV1Api(self.api).read_namespaced_pod_disruption_budget(name, namespace)
            st = pdb.status
            return (f"PodDisruptionBudget {namespace}/{name} allows {st.disruptions_allowed} disruptions now "
                    f"(needs {st.desired_healthy} healthy pods, has {st.current_healthy})")
        except ApiException:
            return f"PodDisruptionBudget {namespace}/{name}: {message}"

    def _check_awaited(self) -> None:
        """waitForDelete: gone when 404 or another UID took the name; not awaited past skipWaitForDeleteTimeout or
        on a NotReady node (whose kubelet cannot finish it)."""
        not_ready = None
        skip_after = self.s["options"].skip_wait_for_delete_timeout
        for key, uid in list(self.awaited.items()):
            pod = self._read(key)
            if pod is None or pod.metadata.uid != uid:
                del self.awaited[key]
                self.gone.append(key)
                continue
            not_ready = self._not_ready() if not_ready is None else not_ready
            deleted = pod.metadata.deletion_timestamp
            age = time.time() - deleted.timestamp() if deleted else 0
            why = ("node NotReady: its kubelet will not finish it" if not_ready else
                   f"terminating for {age:.0f}s, past drain.skipWaitForDeleteTimeout" if skip_after and age > skip_after
                   else None)
            if why:
                del self.awaited[key]
                self.gone.append(key)
                self.not_awaited.append(f"{key} ({why})")
                pulumi.log.warn(f"node {self.node}: not waiting for evicted pod {key} to end ({why}); it goes with "
                                f"the worker")

    def _read(self, key: str) -> Optional[client.V1Pod]:
        namespace, name = key.split("/", 1)
        try:
            return self.core.read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            return None

    def _not_ready(self) -> bool:
        """NotReady, or gone (its worker went meanwhile): either way no kubelet finishes the node's pods."""
        try:
            conditions = self.core.read_node(self.node).status.conditions or []
        except ApiException as e:
            if e.status != 404:
                raise
            return True
        return not any(c.type == "Ready" and c.status == "True" for c in conditions)

    def _came_back(self, listed: DrainList) -> list[str]:
        """Pods scheduled onto the cordoned node after the listing (they tolerate node.kubernetes.io/unschedulable):
        named, not awaited (kubectl waits only for what it evicted); they go with the worker."""
        seen = {v.pod.uid for v in listed.verdicts + listed.refused}
        after = self._listing()
        back = sorted(v.pod.key for v in after.verdicts + after.refused
                      if v.pod.uid not in seen and v.action != "skip")
        if back:
            pulumi.log.warn(f"node {self.node}: {', '.join(back)} came back to the cordoned node (they tolerate "
                            f"node.kubernetes.io/unschedulable); not waited for: they go with the worker")
        return back

    def _report(self, result: dict[str, Any]) -> None:
        if result["skipped"]:
            pulumi.log.info(f"node {self.node}: left in place: {', '.join(result['skipped'])}")
        if self.only is not None:
            return  # the record tells `status` and a resumed replacement how the worker's node was drained
        note = record_drain(self.api, self.node, result)
        if note:
            result["recordNote"] = note

    def _timeout_message(self, e: WaitTimeout) -> str:
        went = sorted(self.evicted)
        budgets = sorted({b for b in self.blocked.values() if b.startswith("PodDisruptionBudget")})
        fix = ("Let the blocking PodDisruptionBudgets allow a disruption (scale up, or move the pods), then re-run "
               "`pulumi up`" if budgets else "Check why those pods do not end, then re-run `pulumi up`")
        return (f"{e}; {self.not_done}. Already evicted: {', '.join(went) or 'none'}. {fix}; "
                f"{self.s.get('bound', 'gpu-migration:timeouts.evict')} bounds this wait")


def _fix_for(code: int, status: dict[str, Any]) -> str:
    """What to do about an eviction answer the drain does not retry (kubernetes pkg/registry/core/pod/storage/
    eviction.go: 500 for a pod under more than one PodDisruptionBudget; 403 from RBAC or a budget whose
    disruptionsAllowed is negative)."""
    message = str(status.get("message") or "")
    if code == 500 and "more than one" in message.lower():
        return "The Eviction API cannot evict a pod that several PodDisruptionBudgets select: merge them into one"
    if code == 403 and "DisruptionBudget" in json.dumps(status.get("details") or {}):
        return "Its PodDisruptionBudget refuses every eviction now: check its status (`kubectl describe pdb`)"
    if code == 403:
        return f"The kubeconfig's user may not evict pods: {fix()}"
    return "Re-run `pulumi up` to retry"


def _status(e: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(e.body)
        return body if isinstance(body, dict) else {}
    except Exception:  # noqa: BLE001 - a non-JSON body keeps the reason phrase
        return {"message": str(e.reason)}
