"""Which new worker replaces which old one: IKS links a new worker to nothing, so replacements in one pool and zone
claim the new workers they see (NewWorkerClaims) and a resumed replacement finds its own (find_replacement)."""
import itertools
import threading
from typing import Any, Optional

import pulumi

from ..common.versions import version_at_least
from .provider import ReplacementError, same_minor
from .workers import failure_message, is_deleting, is_deployed, is_failed, worker_version


class NewWorkerClaims:
    """Which new worker each running replacement follows, across the replacements of this provider process.

    IKS links a new worker to nothing: replaceWorker deletes the old worker and the pool's rebalancing creates a new
    one with a new ID (/work/shared/reference/iks-api.md, "Replace on VPC"). Replacements of one batch in the same pool
    and zone therefore all see every new worker of that zone appear after their request. Those workers are
    interchangeable (same pool, flavor, zone), so each replacement claims one that no other replacement claimed, the
    earliest seen (then an earlier request never takes a worker that a later request alone could have). A claim holds
    for the life of the process. Every dynamic resource of a stack is served by one provider host process
    (pulumi/pulumi sdk/python/lib/pulumi/dynamic/__main__.py: one grpc server, a thread per operation), so this
    registry sees every replacement of a `pulumi up`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._seen: dict[tuple[str, str], int] = {}  # (cluster, worker ID) -> order first seen
        self._owner: dict[tuple[str, str], str] = {}  # (cluster, worker ID) -> claimant (cluster/old worker ID)
        self._requested: dict[tuple[str, str], str] = {}  # (cluster, old worker ID) -> claimant that requested it

    def observe(self, cluster: str, workers: list[dict]) -> None:
        with self._lock:
            for w in workers:
                if (cluster, w["id"]) not in self._seen:
                    self._seen[(cluster, w["id"])] = next(self._order)

    def taken(self, cluster: str, claimant: str) -> frozenset[str]:
        """Worker IDs of `cluster` claimed by other replacements."""
        with self._lock:
            return frozenset(w for (c, w), who in self._owner.items() if c == cluster and who != claimant)

    def requested(self, cluster: str, claimant: str, worker_id: str) -> None:
        """`claimant` asked IKS to replace `worker_id` (it will claim one of the new workers it sees after that)."""
        with self._lock:
            self._requested[(cluster, worker_id)] = claimant

    def busy(self, cluster: str, claimant: str) -> tuple[frozenset[str], frozenset[str]]:
        """Old worker IDs of `cluster` whose replacement another claimant of this process handles: (those that
        already claimed a new worker, those that requested one and have not claimed yet)."""
        with self._lock:
            holders = {who for (c, _), who in self._owner.items() if c == cluster and who != claimant}
            olds = {w: who for (c, w), who in self._requested.items() if c == cluster and who != claimant}
            claimed = {w for w, who in olds.items() if who in holders}
            claimed |= {who.split("/", 1)[1] for who in holders}
            return frozenset(claimed), frozenset(set(olds) - claimed)

    def claim(self, cluster: str, claimant: str, candidates: list[dict]) -> Optional[dict]:
        """The candidate `claimant` already holds, else the earliest-seen unclaimed one (now claimed), else None."""
        with self._lock:
            for w in candidates:
                if self._owner.get((cluster, w["id"])) == claimant:
                    return w
            free = [w for w in candidates if (cluster, w["id"]) not in self._owner]
            if not free:
                return None
            pick = min(free, key=lambda w: self._seen.get((cluster, w["id"]), float("inf")))
            self._owner[(cluster, pick["id"])] = claimant
            return pick


CLAIMS = NewWorkerClaims()


def recorded_by_other_entries(props: dict[str, Any]) -> dict[str, str]:
    """Worker IDs whose nodes the program tied to another config entry (kube/inventory.py workers_of_other_entries).

    A replacement resumed by a new provider process (e.g. after `pulumi refresh` found its worker replaced outside
    Pulumi) has no claims of its batch-mates; this durable record tells it which workers of its pool and zone are
    already another node's. Read through the kubeconfig of the eviction settings; without them nothing is excluded
    (then two candidates stop as ambiguous, never a guess). Worker ID -> config entry."""
    evict = props.get("evict")
    if not evict:
        return {}
    from ..kube.clients import api_client  # kubernetes is only needed when a node is drained or a replacement resumed
    from ..kube.inventory import workers_of_other_entries
    with api_client(evict.get("kubeconfig")) as api:
        return workers_of_other_entries(api, props.get("node_name"))


def record_entry(props: dict[str, Any], node: Optional[str]) -> None:
    """Write this replacement's config entry on its new worker's node (CONFIG_NAME_ANNOTATION, as the switch's readiness
    step does later) the moment the replacement ends: a batch-mate resumed after a kill that came before this node's
    readiness step then counts this worker as taken (pair_new_workers), never as new. Needs the kubeconfig of the
    eviction settings; a failure only warns (the readiness step writes it again)."""
    evict, entry = props.get("evict"), props.get("node_name")
    if not evict or not node or not entry:
        return
    from kubernetes import client  # kubernetes is only needed when a node is drained or a replacement resumed
    from ..kube.clients import api_client
    from ..kube.provider import _short
    from ..kube.records import CONFIG_NAME_ANNOTATION
    try:
        with api_client(evict.get("kubeconfig")) as api:
            client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {CONFIG_NAME_ANNOTATION: entry}}})
    except Exception as e:  # noqa: BLE001 - the replacement itself succeeded
        pulumi.log.warn(f"could not record entry {entry} on node {node} ({CONFIG_NAME_ANNOTATION}): {_short(e)}; its "
                        f"readiness step records it")


def pair_new_workers(waiting: list[str], new: list[str]) -> dict[str, str]:
    """Which new worker goes to which replacement, decided alike by every replacement that asks on its own.

    `waiting`: the config entries of one pool and zone whose old worker is gone and whose new worker nobody recorded
    yet; `new`: that zone's new workers that nobody recorded. IKS links a new worker to nothing, and the new workers
    of one pool and zone are interchangeable (same pool, flavor, zone; README "Nodes of one batch"), so both are
    sorted (entry name, worker ID) and paired in order: every resumed replacement computes the same pairing from the
    same worker list, and no two entries take the same worker. Only when the counts match (every new worker is there
    and none is unexplained); else {} (the caller waits, or refuses to guess)."""
    if len(waiting) != len(new) or len(set(waiting)) != len(waiting) or len(set(new)) != len(new):
        return {}
    return dict(zip(sorted(waiting), sorted(new)))


def current_workers(configured: dict[str, str], recorded: dict[str, str], workers: list[dict]) -> dict[str, str]:
    """Each entry's worker as it is now: after an earlier migration (e.g. a kubeVersion bump) that is the worker its
    node records (`recorded`: worker ID -> entry, CONFIG_NAME_ANNOTATION), not the configured one, which IKS may
    no longer list. Only workers IKS still lists count; otherwise the configured worker."""
    listed = {w["id"] for w in workers}
    current = dict(configured)
    for worker_id, entry in sorted(recorded.items()):
        if entry in current and worker_id in listed and current[entry] not in listed:
            current[entry] = worker_id
    return current


def waiting_entries(old: dict, workers: list[dict], own: str, entries: dict[str, str], resolved: set[str],
                    busy: frozenset[str] = frozenset()) -> list[str]:
    """The config entries of `old`'s pool and zone that wait for a new worker: `own` (whose worker `old` is gone),
    and every other entry whose configured worker is being deleted or deleted there, unless the entry already has
    its new worker (`resolved`: its node carries the entry) or a replacement of this process handles it (`busy`:
    old worker IDs)."""
    gone_here = {w["id"] for w in workers if is_deleting(w) and w.get("poolID") == old.get("poolID")
                 and w.get("location") == old.get("location")}
    return [own, *(e for e, wid in entries.items()
                   if e != own and wid in gone_here and e not in resolved and wid not in busy and wid != old["id"])]


def find_replacement(
    old: dict, workers: list[dict], pool: Optional[dict], target: str, known: Optional[set[str]],
    others: frozenset[str] = frozenset(), waiting: Optional[list[str]] = None, own: Optional[str] = None,
    not_new: frozenset[str] = frozenset(),
) -> list[dict]:
    """The workers that may replace `old` (same pool and zone); empty if none is visible yet.

    `known`: worker IDs seen just before we requested the replacement: every newer worker of the zone is a candidate,
    even a failed one (the caller stops on it), and the caller claims one (NewWorkerClaims: batch-mates in the same
    pool and zone share these candidates). Without it (resuming a replacement requested by an earlier run) the
    replacement is the one sibling still provisioning, else the one sibling at the target's major.minor once the
    zone is back to its size; `others` (workers recorded by other config entries, or claimed by other replacements)
    and failed siblings are never candidates. With `waiting` (waiting_entries, `own` among them) and as many new
    workers (in flight or at the target; `not_new`: other entries' configured workers, never new), the pairing of
    pair_new_workers decides; with fewer, it waits. Else more than one candidate is ambiguous and raises instead of
    guessing. With no candidate but failed siblings, those are returned: the caller stops on them with IKS's
    message instead of waiting for a replacement that IKS will not finish.
    """
    siblings = [
        w for w in workers
        if w["id"] != old["id"] and not is_deleting(w)
        and w.get("poolID") == old.get("poolID") and w.get("location") == old.get("location")
    ]
    zone_size = next(
        (z.get("workerCount") for z in (pool or {}).get("zones", []) if z.get("id") == old.get("location")), None
    )
    if known is None and zone_size is not None and len(siblings) < zone_size:
        return []  # the replacement has not been created yet
    siblings = [w for w in siblings if w["id"] not in others]
    if known is not None:
        return [w for w in siblings if w["id"] not in known]
    failed = [w for w in siblings if is_failed(w)]
    siblings = [w for w in siblings if not is_failed(w)]
    in_flight = [w for w in siblings if not is_deployed(w)]
    at_target = [w for w in siblings if is_deployed(w) and (same_minor(worker_version(w), target)
                                                              or version_at_least(worker_version(w), target))]
    if waiting and own in waiting:
        new = [w for w in in_flight + at_target if w["id"] not in not_new]
        pairing = pair_new_workers(waiting, [w["id"] for w in new])
        if pairing:
            return [w for w in new if w["id"] == pairing[own]]
        if len(new) < len(waiting):
            return failed  # not every new worker is there yet (or one failed: the caller stops naming it)
    candidates = in_flight or at_target
    if not candidates and failed:
        return failed  # the new worker failed: the caller stops at once naming it (never follows it)
    if len(candidates) > 1:
        raise ReplacementError(
            f"worker {old['id']} was replaced but its replacement is ambiguous "
            f"({', '.join(w['id'] for w in candidates)}: new workers of its pool and zone that no other entry "
            f"recorded); set workerId of this node in gpu-migration:nodes to the new worker's ID and re-run "
            f"`pulumi up` (it will not be replaced again)"
        )
    return candidates


def failed_worker_error(worker: dict, cluster: str, old_id: str) -> ReplacementError:
    role = f" (the replacement of {old_id})" if worker["id"] != old_id else ""
    return ReplacementError(
        f"worker {worker['id']} of cluster {cluster}{role} is "
        f"{(worker.get('lifecycle') or {}).get('actualState')}: IKS says: {failure_message(worker)}. Fix the cause "
        f"(see `ibmcloud ks worker get --cluster {cluster} --worker {worker['id']}`), then replace the failed worker "
        f"(`ibmcloud ks worker replace --cluster {cluster} --worker {worker['id']}`) and re-run `pulumi up`: it "
        f"follows the new worker and does not replace anything else"
    )
