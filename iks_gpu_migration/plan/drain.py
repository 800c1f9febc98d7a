"""What a node's drain does with each pod, decided before anything is evicted: `kubectl drain`'s GetPodsForDeletion
(k8s.io/kubectl/pkg/drain drain.go, filters.go at v0.37.2), on plain views so it is tested without a cluster.

Filters in kubectl's order, the first that does not let a pod go decides (filters.go makeFilters):
  skipDeleted (terminating longer than skipWaitForDeleteTimeout: skipped) -> daemonSet (skipped while the DaemonSet
  that controls it exists, as `--ignore-daemonsets`; an orphan needs force) -> mirror (static pods: skipped) ->
  localStorage (emptyDir: refused unless deleteEmptyDirData) -> unreplicated (no controller: refused unless force).
Finished pods always go, by delete (nothing to disrupt). With gpuPodsOnly (the GPU Operator's upgrade policy
`gpuPodDeletion`, k8s-operator-libs upgrade/pod_manager.go) only pods that use a GPU are looked at.
Any refusal stops the whole drain before the first eviction, naming every refused pod and the opt-in.
"""
import re
from dataclasses import dataclass, field
from typing import Literal, Mapping, Optional

Action = Literal["evict", "delete", "await", "skip", "refuse"]


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str = ""
    phase: str = "Running"
    controller: Optional[tuple[str, str]] = None  # (kind, name) of the ownerReference with controller: true
    controller_api: str = ""  # that ownerReference's apiVersion
    mirror: bool = False  # annotation kubernetes.io/config.mirror
    empty_dirs: tuple[str, ...] = ()  # names of its emptyDir volumes
    terminating_for: Optional[float] = None  # seconds since deletionTimestamp; None: not terminating
    uses_gpu: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class DrainOptions:
    force: bool = False  # kubectl --force: bare pods (and orphaned DaemonSet pods) are evicted
    delete_empty_dir_data: bool = False  # kubectl --delete-emptydir-data
    skip_wait_for_delete_timeout: float = 0  # kubectl --skip-wait-for-delete-timeout; 0: wait for every pod
    gpu_pods_only: bool = False


@dataclass(frozen=True)
class Verdict:
    pod: PodView
    action: Action
    reason: str = ""


@dataclass
class DrainList:
    verdicts: list[Verdict] = field(default_factory=list)
    refused: list[Verdict] = field(default_factory=list)  # why each pod may not go (fatal for the whole drain)

    def with_action(self, action: Action) -> list[Verdict]:
        return [v for v in self.verdicts if v.action == action]

    def refusal(self, node: str) -> str:
        """One message naming every refused pod, why, and the opt-ins (kubectl prints them the same way)."""
        pods = "; ".join(f"{v.pod.key}: {v.reason}" for v in self.refused)
        return (f"node {node} cannot be drained without losing data or pods nothing re-creates: {pods}. Nothing was "
                f"evicted. Move these pods yourself, or opt in to losing them in the stack config")


def pods_for_deletion(pods: list[PodView], daemonsets: set[tuple[str, str]], opts: DrainOptions) -> DrainList:
    """`daemonsets`: (namespace, name) of the DaemonSets that exist, for the pods a DaemonSet controls."""
    out = DrainList()
    for pod in pods:
        verdict = _verdict(pod, daemonsets, opts)
        (out.refused if verdict.action == "refuse" else out.verdicts).append(verdict)
    return out


def _verdict(pod: PodView, daemonsets: set[tuple[str, str]], opts: DrainOptions) -> Verdict:
    if opts.gpu_pods_only and not pod.uses_gpu:
        return Verdict(pod, "skip", "uses no GPU (drain.gpuPodsOnly)")
    if pod.terminating_for is not None and opts.skip_wait_for_delete_timeout and \
            pod.terminating_for > opts.skip_wait_for_delete_timeout:
        return Verdict(pod, "skip", f"terminating for {pod.terminating_for:.0f}s, longer than "
                                    f"drain.skipWaitForDeleteTimeout")
    if pod.mirror:  # whatever its phase (filters.go mirrorPodFilter)
        return Verdict(pod, "skip", "mirror (static) pod: the kubelet runs it from a file")
    if pod.finished:
        return Verdict(pod, "delete", f"finished ({pod.phase})")
    kind, owner = pod.controller or ("", "")
    # kubectl's daemonSetFilter (k8s.io/kubectl pkg/drain/filters.go) looks at the controller's Kind only, then gets
    # the apps/v1 DaemonSet of that name in the pod's namespace: another group's DaemonSet (OpenKruise's) is looked
    # up the same way, and refused unless --force when no apps/v1 one of its name exists.
    if kind == "DaemonSet":
        if (pod.namespace, owner) in daemonsets:
            return Verdict(pod, "skip", f"DaemonSet {owner} keeps it on the node")
        other = f" (its controller is {pod.controller_api}, which kubectl drain does not know either)" \
            if pod.controller_api and pod.controller_api != "apps/v1" else ""
        if not opts.force:
            return Verdict(pod, "refuse", f"no apps/v1 DaemonSet {owner} exists{other}, so nothing known re-creates "
                                          f"it (drain.force: true evicts it)")
        return _go(pod, f"orphan of the DaemonSet {owner}, which does not exist{other} (drain.force)")
    if pod.empty_dirs and not opts.delete_empty_dir_data:
        return Verdict(pod, "refuse", f"emptyDir volume {', '.join(pod.empty_dirs)} would lose its data "
                                      f"(drain.deleteEmptyDirData: true accepts that)")
    if pod.controller is None and not opts.force:
        return Verdict(pod, "refuse", "declares no controller, so nothing re-creates it elsewhere "
                                      "(drain.force: true evicts it anyway)")
    notes = [n for n, on in (("emptyDir data deleted", bool(pod.empty_dirs)), ("no controller", pod.controller is None))
             if on]
    return _go(pod, ", ".join(notes))


def _go(pod: PodView, reason: str) -> Verdict:
    """A terminating pod is already on its way out: it is awaited, never evicted again (the kubelet finishes it)."""
    return Verdict(pod, "await" if pod.terminating_for is not None else "evict", reason)


# --- Answers of the Eviction API (kubernetes pkg/registry/core/pod/storage/eviction.go at v1.37.2) ----------------

_BUDGET = re.compile(r"disruption budget (\S+)")


@dataclass(frozen=True)
class TooMany:
    """A 429: a PodDisruptionBudget allows no disruption now (status cause DisruptionBudget, as checkAndDecrement
    and createTooManyRequestsError answer), or the server throttles (API Priority and Fairness, max-inflight), which
    sends Retry-After and no such cause."""
    budget: Optional[str]  # the PDB's name when a budget refused
    message: str
    retry_after: float  # seconds the server asks to wait; 0 when it names none


def too_many(status: Mapping, retry_after_header: Optional[str]) -> TooMany:
    """`status`: the metav1.Status body of the 429."""
    details = status.get("details") or {}
    causes = details.get("causes") or []
    # metav1.StatusCause serialises its Type as "reason" (k8s.io/apimachinery pkg/apis/meta/v1 types.go).
    budget_causes = [c.get("message") or "" for c in causes if c.get("reason") == "DisruptionBudget"]
    name = None
    for text in budget_causes:
        match = _BUDGET.search(text)
        name = name or (match.group(1) if match else None)
    message = "; ".join(filter(None, budget_causes)) or status.get("message") or "Too Many Requests"
    retry = _seconds(retry_after_header) or float(details.get("retryAfterSeconds") or 0)
    return TooMany(name if budget_causes else None, message, retry)


def namespace_terminating(status: Mapping) -> bool:
    """403 from NamespaceLifecycle admission: no new content (an eviction is a create) in a terminating namespace
    (kubernetes plugin/pkg/admission/namespace/lifecycle; kubectl drain.go retries it)."""
    causes = (status.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "NamespaceTerminating" for c in causes)


def _seconds(header: Optional[str]) -> float:
    try:
        return max(0.0, float(header)) if header else 0.0
    except ValueError:
        return 0.0  # an HTTP date: honoured as "retry later" by the regular backoff
