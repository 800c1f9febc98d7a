"""Dynamic providers for the IKS side of the migration: master version, worker replacement, temporary GPU pool.

Providers are pickled by dill into the state, so they hold no clients: each operation builds its own IksClient.
The API key comes from the `api` input (a Pulumi secret), else the stack config gpu-migration:ibmApiKey (seen by the
provider's `configure`, which is what `delete` relies on: outputs never hold the key), else IC_API_KEY.
"""
import itertools
import threading
import time
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from .iks_api import (
    API_KEY_CONFIG,
    MASTER_BUSY,
    IksClient,
    IksApiError,
    describe_worker,
    failure_message,
    is_deleted,
    is_deleting,
    is_deployed,
    is_failed,
    is_ready,
    primary_ip,
    worker_version,
)
from .versions import minor_steps, version_at_least, version_key
from .waiting import WaitTimeout, optional_float, wait_for

# terraform-provider-ibm waits for three healthy readings in a row (masterStatus Ready, worker health normal)
# before it calls a master or worker "done": health flaps while a fresh node settles.
STABLE_READINGS = 3
MAX_MASTER_REQUESTS = 3  # an update that keeps falling back to the old version needs a human


class ReplacementError(RuntimeError):
    """The worker's state does not let us tell what to do without a human (e.g. its replacement is ambiguous)."""


def _log(message: str) -> None:
    pulumi.log.info(message)


def _public(props: dict[str, Any]) -> dict[str, Any]:
    """Inputs as they may appear in outputs: without the API key or the serialized provider."""
    out = {k: v for k, v in props.items() if not k.startswith("__")}
    out["api"] = {k: v for k, v in (props.get("api") or {}).items() if k != "api_key"}
    return out


class _IksProvider(dyn.ResourceProvider):
    def configure(self, req: dyn.ConfigureRequest) -> None:
        self._stack_api_key = req.config.get(API_KEY_CONFIG)

    def client(self, props: dict[str, Any]) -> IksClient:
        return IksClient.from_api(props.get("api") or {}, getattr(self, "_stack_api_key", None))

    @staticmethod
    def timing(props: dict[str, Any], default_timeout: float) -> tuple[float, float]:
        return optional_float(props.get("timeout"), default_timeout), optional_float(props.get("poll_interval"), 15)

    @staticmethod
    def readings(props: dict[str, Any]) -> int:
        return int(optional_float(props.get("stable_readings"), STABLE_READINGS))


class Streak:
    """Counts consecutive good readings per key; a bad reading starts the count again (health flapping)."""

    def __init__(self, needed: int) -> None:
        self.needed, self.counts = max(1, needed), {}

    def see(self, key: str, good: bool) -> bool:
        self.counts[key] = self.counts.get(key, 0) + 1 if good else 0
        return self.counts[key] >= self.needed

    def of(self, key: str) -> str:
        return f"{self.counts.get(key, 0)}/{self.needed} good readings in a row"


def major_minor(version: Optional[str]) -> str:
    return ".".join(str(n) for n in version_key(version)[:2])


def same_minor(actual: Optional[str], target: str) -> bool:
    """A worker IKS created at `target` runs its major.minor with the newest worker fix pack (either direction)."""
    return bool(version_key(actual)) and version_key(actual)[:2] == version_key(target)[:2]


def master_rests(info: dict) -> bool:
    """deployed + normal + Ready: no master operation runs (terraform waitForVpcClusterMasterAvailable)."""
    life = info.get("lifecycle") or {}
    return (life.get("masterState") == "deployed" and life.get("masterHealth") == "normal"
            and life.get("masterStatus") == "Ready")


def describe_master(info: dict) -> str:
    life = info.get("lifecycle") or {}
    return (f"master {info.get('masterKubeVersion')} (target {info.get('targetVersion')}) "
            f"{life.get('masterState')}/{life.get('masterHealth')} ({life.get('masterStatus')})")


# 1. Master version ---------------------------------------------------------------------------------------------

class MasterVersionProvider(_IksProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        return dyn.CreateResult(props["cluster"], self._ensure(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        return dyn.UpdateResult(self._ensure(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        replaces = ["cluster"] if olds.get("cluster") != news["cluster"] else []
        changed = bool(replaces) or olds.get("version") != news["version"]
        return dyn.DiffResult(changes=changed, replaces=replaces)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _log(f"master of cluster {props.get('cluster')}: nothing to delete (a master is never downgraded)")

    def _ensure(self, props: dict[str, Any]) -> dict[str, Any]:
        """Step the master up one minor version at a time to `version`, waiting for it to rest after each."""
        cluster, target = props["cluster"], props["version"]
        client = self.client(props)
        info = client.get_cluster(cluster)
        steps = minor_steps(info.get("masterKubeVersion"), target)
        offered = client.kube_versions() if steps else set()
        missing = [s for s in steps if ".".join(s.split(".")[:2]) not in offered]
        if missing:  # checked before the first step: a typo must not start irreversible updates
            raise IksApiError(
                f"kubeVersion {target}: master of cluster {cluster} is at {info.get('masterKubeVersion')} and IKS "
                f"offers no Kubernetes {', '.join(missing)} (offered: {', '.join(sorted(offered)) or 'none'}); "
                f"nothing was updated"
            )
        for step in steps or [target]:
            info = self._update_to(client, cluster, step, props)
        return {**_public(props), "actual_version": info.get("masterKubeVersion")}

    def _update_to(self, client: IksClient, cluster: str, target: str, props: dict[str, Any]) -> dict:
        """Wait until the master rests (deployed, normal, Ready on several readings in a row); if it rests below
        `target`, request the update (again: an update can fall back to the old version) and keep waiting.

        targetVersion is not read: it can be newer than masterKubeVersion at rest, after a failed update.
        A PUT refused with Ef9cc (another master operation just started) is waited out like a busy master."""
        timeout, interval = self.timing(props, 3600)
        streak, requests = Streak(self.readings(props)), []

        def poll() -> tuple[bool, dict, str]:
            now = client.get_cluster(cluster)
            state = describe_master(now)
            if not streak.see("master", master_rests(now)):
                return False, now, f"{state}; {streak.of('master')}"
            if version_at_least(now.get("masterKubeVersion"), target):
                return True, now, state
            if len(requests) >= MAX_MASTER_REQUESTS:
                raise IksApiError(
                    f"the update of the master of cluster {cluster} to {target} was requested {len(requests)} times "
                    f"and the master fell back to {now.get('masterKubeVersion')} each time ({state}); see "
                    f"`ibmcloud ks cluster get --cluster {cluster}` for the reason, fix it and re-run `pulumi up`"
                )
            _log(f"master of cluster {cluster} rests at {now.get('masterKubeVersion')}; requesting update to "
                 f"{target}" + (" again (the last update did not take)" if requests else ""))
            try:
                client.update_master(cluster, target)
            except IksApiError as e:
                if e.code != MASTER_BUSY:
                    raise
                streak.see("master", False)
                return False, now, f"IKS refused the update while another master operation runs: {e}"
            requests.append(target)
            streak.see("master", False)
            return False, now, f"update to {target} requested"

        return wait_for(f"master of cluster {cluster} at {target} (deployed, normal, Ready)", poll, timeout, interval)


def wait_master_at(client: IksClient, cluster: str, target: str, props: dict[str, Any]) -> None:
    """Gate before a worker is replaced: the master rests at the target's major.minor (or newer)."""
    timeout, interval = _IksProvider.timing(props, 5400)
    streak = Streak(_IksProvider.readings(props))

    def poll() -> tuple[bool, None, str]:
        info = client.get_cluster(cluster)
        if master_rests(info) and not version_at_least(info.get("masterKubeVersion"), major_minor(target)):
            raise ReplacementError(
                f"the master of cluster {cluster} is at {info.get('masterKubeVersion')}, below kubeVersion {target}: "
                f"a worker replaced now would come up at the master's version. Nothing was replaced; the master "
                f"version resource must finish first (re-run `pulumi up`)"
            )
        return streak.see("master", master_rests(info)), None, f"{describe_master(info)}; {streak.of('master')}"

    wait_for(f"master of cluster {cluster} to rest before a worker replacement", poll, timeout, interval)


class MasterVersion(dyn.Resource, module="gpu-migration", name="MasterVersion"):
    """The cluster master at `version` or newer; workers must depend on this before they are replaced."""

    cluster: pulumi.Output[str]
    version: pulumi.Output[str]
    actual_version: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cluster: pulumi.Input[str],
        version: pulumi.Input[str],
        api: pulumi.Input[dict],
        timeout: pulumi.Input[float] = 3600,
        poll_interval: pulumi.Input[float] = 15,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        props = {"cluster": cluster, "version": version, "api": api, "timeout": timeout,
                 "poll_interval": poll_interval, "actual_version": None}
        super().__init__(MasterVersionProvider(), name, props, opts)


# 2. Worker replacement -----------------------------------------------------------------------------------------

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

    def observe(self, cluster: str, workers: list[dict]) -> None:
        with self._lock:
            for w in workers:
                if (cluster, w["id"]) not in self._seen:
                    self._seen[(cluster, w["id"])] = next(self._order)

    def taken(self, cluster: str, claimant: str) -> frozenset[str]:
        """Worker IDs of `cluster` claimed by other replacements."""
        with self._lock:
            return frozenset(w for (c, w), who in self._owner.items() if c == cluster and who != claimant)

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


def recorded_by_other_entries(props: dict[str, Any]) -> frozenset[str]:
    """Worker IDs whose nodes the program tied to another config entry (kube_checks.workers_of_other_entries).

    A replacement resumed by a new provider process (e.g. after `pulumi refresh` found its worker replaced outside
    Pulumi) has no claims of its batch-mates; this durable record tells it which workers of its pool and zone are
    already another node's. Read through the kubeconfig of the eviction settings; without them nothing is excluded
    (then two candidates stop as ambiguous, never a guess)."""
    evict = props.get("evict")
    if not evict:
        return frozenset()
    from kubernetes import config  # kubernetes is only needed when a node is drained or a replacement resumed
    from .kube_checks import workers_of_other_entries
    with config.new_client_from_config(config_file=evict.get("kubeconfig") or None) as api:
        return frozenset(workers_of_other_entries(api, props.get("node_name")))


def find_replacement(
    old: dict, workers: list[dict], pool: Optional[dict], target: str, known: Optional[set[str]],
    others: frozenset[str] = frozenset(),
) -> list[dict]:
    """The workers that may replace `old` (same pool and zone); empty if none is visible yet.

    `known`: worker IDs seen just before we requested the replacement: every newer worker of the zone is a candidate,
    even a failed one (the caller stops on it), and the caller claims one (NewWorkerClaims: batch-mates in the same
    pool and zone share these candidates). Without it (resuming a replacement requested by an earlier run) the
    replacement is the one sibling still provisioning, else the one sibling at the target's major.minor once the
    zone is back to its size; `others` (workers recorded by other config entries, or claimed by other replacements)
    and failed siblings are never candidates. More than one candidate then is ambiguous and raises instead of
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
    candidates = in_flight or [w for w in siblings if same_minor(worker_version(w), target)
                               or version_at_least(worker_version(w), target)]
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


_RECORDED = ("old_worker_id", "new_worker_id", "node_name", "actual_version")


class WorkerReplacementProvider(_IksProvider):
    """Outputs record the worker this resource ended with (`new_worker_id`) and its node (`node_name`): a later
    kubeVersion bump starts from them, so the config never has to be edited after a replacement."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        return dyn.CreateResult(props["worker_id"], self._replace(props, props["worker_id"]))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        """Another cluster, or a worker other than the recorded old/new one, replaces; a kubeVersion change is an
        update that replaces the current worker (from state) once."""
        recorded = {olds.get("old_worker_id"), olds.get("new_worker_id"), olds.get("worker_id")}
        replaces = ["cluster"] if olds.get("cluster") != news.get("cluster") else []
        if news.get("worker_id") not in recorded:
            replaces.append("worker_id")
        # `pulumi refresh` found the recorded worker gone (replaced outside Pulumi): the update follows it.
        drifted = olds.get("worker_state") == "deleted"
        changed = bool(replaces) or drifted or olds.get("kube_version") != news.get("kube_version")
        return dyn.DiffResult(changes=changed, replaces=replaces, delete_before_replace=False)

    def read(self, id_: str, props: dict[str, Any]) -> dyn.ReadResult:
        """`pulumi refresh`: the recorded new worker as IKS has it now — its state, version and node. A worker
        replaced outside Pulumi reads `deleted`; the next `up` then follows it to its replacement (no new replace)."""
        worker = self.client(props).get_worker(props["cluster"], props.get("new_worker_id") or props["worker_id"])
        state = ((worker or {}).get("lifecycle") or {}).get("actualState") or "deleted"
        outs = {**props, "worker_state": state}
        if worker and state != "deleted":
            outs["actual_version"] = (worker.get("kubeVersion") or {}).get("actual") or props.get("actual_version")
            outs["node_name"] = primary_ip(worker) or props.get("node_name")
        return dyn.ReadResult(id_, outs)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        """kubeVersion bump: replace the worker this resource ended with last time (never the configured old ID).
        After a refresh that found that worker replaced outside Pulumi, the same resumable path follows it to the
        worker that took its place instead of replacing anything."""
        current = olds.get("new_worker_id") or news["worker_id"]
        outs = self._replace(news, current)
        return dyn.UpdateResult({**outs, "old_worker_id": current, "worker_state": "deployed"})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _log(f"worker replacement {props.get('old_worker_id')} -> {props.get('new_worker_id')}: "
             f"nothing to delete (a replaced worker cannot be un-replaced)")

    def _replace(self, props: dict[str, Any], start: str) -> dict[str, Any]:
        """Resumable: each poll reads the real worker state and takes the next step from there.

        current worker created by this run, or at target -> wait until deployed/normal/Ready on several readings;
        current worker being deleted                      -> follow it to its replacement and keep waiting;
        current worker failed                             -> stop with IKS's message;
        current worker deployed, older                    -> gates (master, only GPU node, eviction), then request
                                                             replace(update=true) once, remembering the IDs seen.
        A worker this resource followed to is never replaced again, whatever fix pack IKS gave it.
        """
        cluster, target = props["cluster"], props["kube_version"]
        timeout, interval = self.timing(props, 5400)
        grace = optional_float(props.get("rebalance_timeout"), 900)
        client = self.client(props)
        others = frozenset(props.get("other_worker_ids") or []) - {start}
        claimant = f"{cluster}/{start}"
        streak = Streak(self.readings(props))
        st: dict[str, Any] = {"current": start, "known": None, "requested": set(), "followed": [],
                              "created": set(), "orphaned_at": None, "prepared": set()}
        first = {w["id"]: w for w in client.list_workers(cluster, show_deleted=True)}.get(start)
        if first is not None and self._needs_replacement(first, target):
            # The gates (master, eviction) may take their own bounded time: not counted against the replace wait.
            self._before_replace(client, props, first)
            st["prepared"].add(start)

        def poll() -> tuple[bool, Optional[dict], str]:
            workers = client.list_workers(cluster, show_deleted=True)
            CLAIMS.observe(cluster, workers)
            by_id = {w["id"]: w for w in workers}
            cur = by_id.get(st["current"])
            if cur is None:
                raise ReplacementError(
                    f"worker {st['current']} not found in cluster {cluster} (neither live nor deleted); "
                    f"check workerId of node {props.get('node_name')} in gpu-migration:nodes"
                )
            if is_failed(cur):
                raise failed_worker_error(cur, cluster, st["followed"][-1] if st["followed"] else start)
            if is_deleting(cur):
                resumed = st["known"] is None  # not requested by this process: its batch-mates' claims are unknown
                pool = client.get_worker_pool(cluster, cur.get("poolID")) if resumed else None
                recorded = recorded_by_other_entries(props) if resumed else frozenset()
                candidates = find_replacement(cur, workers, pool, target, st["known"],
                                              others | recorded | CLAIMS.taken(cluster, claimant))
                new = CLAIMS.claim(cluster, claimant, candidates)
                if new is None:
                    return False, None, self._orphan(cur, cluster, st, grace)
                if is_failed(new):  # never followed: IKS does not retry a failed worker by itself
                    raise failed_worker_error(new, cluster, cur["id"])
                _log(f"worker {cur['id']} of cluster {cluster} is replaced by {new['id']}")
                st["followed"].append(cur["id"])
                st["created"].add(new["id"])
                st.update(current=new["id"], known=None, orphaned_at=None)
                cur = new
            if cur["id"] in st["created"]:
                if worker_version(cur) and not same_minor(worker_version(cur), target):
                    raise ReplacementError(
                        f"IKS replaced worker {st['followed'][-1]} of cluster {cluster} by {cur['id']} at "
                        f"{worker_version(cur)}, not at kubeVersion {target}; it is not replaced again. Check the "
                        f"master version (`ibmcloud ks cluster get --cluster {cluster}`) and re-run `pulumi up`"
                    )
                return self._settled(cur, streak)
            if version_at_least(worker_version(cur), target):
                return self._settled(cur, streak)
            if cur["id"] in st["requested"]:
                return False, None, f"replacement requested, not started yet: {describe_worker(cur)}"
            if is_deployed(cur):
                if cur["id"] not in st["prepared"]:
                    self._before_replace(client, props, cur)
                    st["prepared"].add(cur["id"])
                st["known"] = set(by_id)
                st["requested"].add(cur["id"])
                drained = primary_ip(cur) if props.get("evict") else None
                self._request(client, cluster, cur, drained)
                return False, None, f"replacement of worker {cur['id']} (update to {target}) requested"
            return False, None, describe_worker(cur)

        what = f"worker {start} of cluster {cluster} replaced at {target} (deployed, normal, Ready)"
        try:
            new = wait_for(what, poll, timeout, interval)
        except WaitTimeout as e:
            started = st["requested"] or st["followed"]
            detail = (
                f"the replacement of worker {start} was requested (new worker: "
                f"{st['current'] if st['current'] != start else 'not visible yet'}); re-running `pulumi up` "
                f"resumes waiting without replacing it again"
                if started else f"worker {start} was not replaced; re-running `pulumi up` retries"
            )
            raise WaitTimeout(f"{e}; {detail}") from None
        actual = worker_version(new)
        if new["id"] in st["created"] and not version_at_least(actual, target):
            pulumi.log.warn(f"worker {new['id']} runs {actual}: IKS's newest worker fix pack, not the pinned "
                            f"kubeVersion {target}; it is not replaced again")
        return {
            **_public(props),
            "old_worker_id": start,
            "new_worker_id": new["id"],
            "node_name": primary_ip(new) or props.get("node_name"),
            "actual_version": actual,
        }

    @staticmethod
    def _needs_replacement(worker: dict, target: str) -> bool:
        return is_deployed(worker) and not is_deleting(worker) and not version_at_least(worker_version(worker), target)

    @staticmethod
    def _settled(worker: dict, streak: Streak) -> tuple[bool, Optional[dict], str]:
        done = streak.see(worker["id"], is_ready(worker))
        return done, worker, f"{describe_worker(worker)}; {streak.of(worker['id'])}"

    @staticmethod
    def _orphan(cur: dict, cluster: str, st: dict[str, Any], grace: float) -> str:
        """The old worker is gone and no new one shows: with automatic rebalancing off IKS creates none."""
        state = f"{describe_worker(cur)}; its replacement is not visible yet"
        if not is_deleted(cur):
            return state
        st["orphaned_at"] = st["orphaned_at"] or time.monotonic()
        if time.monotonic() - st["orphaned_at"] > grace:
            pool = cur.get("poolName") or cur.get("poolID")
            raise ReplacementError(
                f"worker {cur['id']} of cluster {cluster} was deleted and no new worker appeared in its pool {pool} "
                f"(zone {cur.get('location')}) within {grace:.0f}s: automatic rebalancing of the pool looks off, "
                f"so IKS will not create the replacement. Rebalance the pool (`ibmcloud ks worker-pool rebalance "
                f"--cluster {cluster} --worker-pool {pool}`) and re-run `pulumi up`: it picks up the new worker"
            )
        return state

    def _before_replace(self, client: IksClient, props: dict[str, Any], worker: dict) -> None:
        """The gates every replaceWorker passes: another GPU node exists, the master rests at the target, and the
        node's workloads were moved off it (cordon + Eviction API)."""
        cluster = props["cluster"]
        if props.get("single_gpu_node"):
            raise ReplacementError(
                f"worker {worker['id']} is the only GPU node of cluster {cluster}: replacing it leaves GPU "
                f"workloads nowhere to run; enable gpu-migration:tempGpuPool (flavor, zone) first. "
                f"Nothing was replaced."
            )
        wait_master_at(client, cluster, props["kube_version"], props)
        evict = props.get("evict")
        if evict and primary_ip(worker):
            from . import node_eviction  # kubernetes is only needed when a node is drained
            node_eviction.drain(primary_ip(worker), evict)

    @staticmethod
    def _request(client: IksClient, cluster: str, worker: dict, drained: Optional[str] = None) -> None:
        """A refused request (4xx) is an error naming the worker, unless the worker is in fact being replaced."""
        _log(f"replacing worker {worker['id']} of cluster {cluster} (update=true) from {worker_version(worker)}")
        try:
            client.replace_worker(cluster, worker["id"])
        except IksApiError as e:
            if not (e.status_code and 400 <= e.status_code < 500):
                raise
            after = client.get_worker(cluster, worker["id"])
            if after is not None and is_deleting(after):
                _log(f"worker {worker['id']} is already being replaced ({e})")
                return
            drain_note = (f"; its node {drained} was cordoned and drained before the request: `kubectl uncordon "
                          f"{drained}` if you give up the replacement" if drained else "")
            raise IksApiError(f"IKS refused the replacement, worker {worker['id']} is unchanged: {e}{drain_note}",
                              e.status_code) from None


class WorkerReplacement(dyn.Resource, module="gpu-migration", name="WorkerReplacement"):
    """`worker_id` replaced (update=true) by a worker at `kube_version`; resumes an interrupted replacement."""

    old_worker_id: pulumi.Output[str]
    new_worker_id: pulumi.Output[str]
    node_name: pulumi.Output[str]  # the new worker's Kubernetes node name (its primary private IP on VPC)
    kube_version: pulumi.Output[str]
    actual_version: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cluster: pulumi.Input[str],
        worker_id: pulumi.Input[str],
        node_name: pulumi.Input[str],
        kube_version: pulumi.Input[str],
        api: pulumi.Input[dict],
        timeout: pulumi.Input[float] = 5400,
        poll_interval: pulumi.Input[float] = 15,
        other_worker_ids: Optional[pulumi.Input[list]] = None,
        single_gpu_node: pulumi.Input[bool] = False,
        evict: Optional[pulumi.Input[dict]] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        """`other_worker_ids`: workers of the other GPU nodes (configured and replaced IDs); optional, it only helps
        tell this node's replacement apart from an already-migrated sibling when resuming.
        `evict`: node_eviction settings (kubeconfig, timeout, poll_interval, gpu_nodes, gpu_resources); when set,
        the node is cordoned and its pods evicted before each replaceWorker."""
        props = {"cluster": cluster, "worker_id": worker_id, "node_name": node_name, "kube_version": kube_version,
                 "api": api, "timeout": timeout, "poll_interval": poll_interval,
                 "other_worker_ids": other_worker_ids or [], "single_gpu_node": single_gpu_node, "evict": evict,
                 "old_worker_id": None, "new_worker_id": None, "actual_version": None}
        super().__init__(WorkerReplacementProvider(), name, props, opts)


# 3. Temporary GPU worker pool ----------------------------------------------------------------------------------

_POOL_SHAPE = ("cluster", "pool_name", "flavor", "zone", "vpc_id", "subnet_id", "size_per_zone")


def pool_state(pool: Optional[dict]) -> str:
    """active / deleting / deleted / ... ; a removed pool stays readable with actualState deleted (#3595)."""
    if pool is None:
        return "absent"
    life = pool.get("lifecycle") or {}
    if life.get("actualState") == "deleted":
        return "deleted"
    if life.get("desiredState") == "deleted" or life.get("actualState") == "deleting":
        return "deleting"
    return life.get("actualState") or "present"


class TempGpuPoolProvider(_IksProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        cluster, name = props["cluster"], props["pool_name"]
        timeout, interval = self.timing(props, 3600)
        client = self.client(props)
        pool = client.get_worker_pool(cluster, name)
        if pool_state(pool) == "deleting":  # never adopt a pool on its way out: wait, then create a new one
            _log(f"worker pool {name} of cluster {cluster} is being removed; waiting before creating it again")
            self._wait_removed(client, cluster, name, pool.get("id"), timeout, interval)
            pool = None
        if pool_state(pool) not in ("absent", "deleted"):
            _log(f"worker pool {name} already exists in cluster {cluster}; adopting it")
            if pool.get("flavor") and pool["flavor"] != props["flavor"]:
                pulumi.log.warn(f"adopted worker pool {name} has flavor {pool['flavor']}, not {props['flavor']}")
        else:
            _log(f"creating worker pool {name} ({props['flavor']} x{props['size_per_zone']} in {props['zone']})")
            try:
                created = client.create_worker_pool(cluster, name, props["flavor"], props["vpc_id"], props["zone"],
                                                    props["subnet_id"], int(props["size_per_zone"]))
            except IksApiError as e:
                # ibm-cloud-sdk-core retries a POST whose answer was lost (5xx): the retry meets our own pool.
                if e.status_code != 409:
                    raise
                created = {}
                _log(f"worker pool {name} already exists after a retried create (the first request went "
                     f"through); adopting it")
            pool = client.get_worker_pool(cluster, created.get("workerPoolID") or name) or {}
            if pool_state(pool) in ("deleting", "deleted"):
                raise IksApiError(f"worker pool {name} of cluster {cluster} reads {pool_state(pool)} right after "
                                  f"it was created; re-run `pulumi up`")
        size = int(props["size_per_zone"])
        streak = Streak(self.readings(props))
        pool_id = pool.get("id") or name

        def poll() -> tuple[bool, list[dict], str]:
            workers = [w for w in client.list_workers(cluster, pool=pool_id) if not is_deleting(w)]
            failed = [w for w in workers if is_failed(w)]
            if failed:
                w = failed[0]
                raise IksApiError(
                    f"worker {w['id']} of the temporary pool {name} is {(w.get('lifecycle') or {}).get('actualState')}:"
                    f" IKS says: {failure_message(w)}. Fix the cause (flavor available in {props['zone']}? quota? "
                    f"free IPs in subnet {props['subnet_id']}?), then replace it (`ibmcloud ks worker replace "
                    f"--cluster {cluster} --worker {w['id']}`) or remove the pool, and re-run `pulumi up`"
                )
            ready = [w for w in workers if streak.see(w["id"], is_ready(w))]
            state = f"{len(ready)}/{size} ready: " + ("; ".join(describe_worker(w) for w in workers) or "no workers")
            return len(ready) >= size, ready, state

        ready = wait_for(f"workers of pool {name} in cluster {cluster} (deployed, normal, Ready)",
                         poll, timeout, interval)
        return dyn.CreateResult(pool_id, {
            **_public(props),
            "pool_id": pool_id,
            "worker_ids": sorted(w["id"] for w in ready),
            "node_names": sorted(filter(None, (primary_ip(w) for w in ready))),
        })

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        replaces = [k for k in _POOL_SHAPE if olds.get(k) != news.get(k)]
        return dyn.DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        # Not reached through diff; keeps the recorded pool if it is.
        return dyn.UpdateResult({**olds, **_public(news)})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        cluster, name = props["cluster"], props["pool_name"]
        timeout, interval = self.timing(props, 3600)
        client = self.client(props)
        pool = client.get_worker_pool(cluster, props.get("pool_id") or name)
        if pool_state(pool) in ("absent", "deleted"):
            _log(f"worker pool {name} of cluster {cluster} is already removed")
            return
        _log(f"removing worker pool {name} from cluster {cluster}")
        client.remove_worker_pool(cluster, name)
        self._wait_removed(client, cluster, name, pool.get("id"), timeout, interval)

    @staticmethod
    def _wait_removed(client: IksClient, cluster: str, name: str, pool_id: Optional[str], timeout: float,
                      interval: float) -> None:
        """Done when the pool reads deleted (or is gone) and every one of its workers reads deleted, as
        terraform-provider-ibm resource_ibm_container_vpc_worker_pool.go waits on delete (getWorkers showDeleted=true)."""

        def poll() -> tuple[bool, None, str]:
            pool = client.get_worker_pool(cluster, pool_id or name)
            ident = (pool or {}).get("id") or pool_id
            workers = [w for w in client.list_workers(cluster, show_deleted=True)
                       if ident and w.get("poolID") == ident and not is_deleted(w)]
            state = f"pool {pool_state(pool)}; " + (
                "; ".join(describe_worker(w) for w in workers) or "all workers deleted")
            return pool_state(pool) in ("absent", "deleted") and not workers, None, state

        wait_for(f"worker pool {name} of cluster {cluster} removed (pool and workers deleted)", poll, timeout,
                 interval)


class TempGpuPool(dyn.Resource, module="gpu-migration", name="TempGpuPool"):
    """A temporary VPC GPU worker pool (one zone), ready before the first replacement; adopted if it exists."""

    pool_id: pulumi.Output[str]
    pool_name: pulumi.Output[str]
    worker_ids: pulumi.Output[list]
    node_names: pulumi.Output[list]

    def __init__(
        self,
        name: str,
        cluster: pulumi.Input[str],
        pool_name: pulumi.Input[str],
        flavor: pulumi.Input[str],
        zone: pulumi.Input[str],
        vpc_id: pulumi.Input[str],
        subnet_id: pulumi.Input[str],
        size_per_zone: pulumi.Input[int],
        api: pulumi.Input[dict],
        timeout: pulumi.Input[float] = 3600,
        poll_interval: pulumi.Input[float] = 15,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        props = {"cluster": cluster, "pool_name": pool_name, "flavor": flavor, "zone": zone, "vpc_id": vpc_id,
                 "subnet_id": subnet_id, "size_per_zone": size_per_zone, "api": api, "timeout": timeout,
                 "poll_interval": poll_interval, "pool_id": None, "worker_ids": None, "node_names": None}
        super().__init__(TempGpuPoolProvider(), name, props, opts)
