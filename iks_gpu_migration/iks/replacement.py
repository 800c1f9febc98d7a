"""WorkerReplacement: one worker replaced (update=true) by a worker at the target version, resumable from IKS's state."""
import time
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from ..common.versions import version_at_least
from ..common.waiting import WaitTimeout, optional_float, wait_for
from ..kube.drain_budget import hold_for_budget
from ..kube.refusals import explained
from ..plan.iks_rules import PoolRules
from .api import IksApiError, IksClient
from . import claims, pool_rules
from .claims import (current_workers, failed_worker_error, find_replacement, record_entry, recorded_by_other_entries,
                     waiting_entries)
from .master import wait_master_at
from .provider import ReplacementError, Streak, _IksProvider, _log, _public, same_minor
from .workers import describe_worker, is_deleted, is_deleting, is_deployed, is_failed, is_ready, primary_ip, worker_version


# The inputs the outputs repeat: diff compares them, read and a kubeVersion bump's update start from them.
KEPT_INPUTS = ("api", "cluster", "kube_version", "worker_id", "node_name")


def compact_drain(record: Optional[dict]) -> Optional[dict]:
    """What the drain moved, without its empty lists (`status` reads a missing list as empty)."""
    return {k: v for k, v in record.items() if v} if isinstance(record, dict) else record


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
        """_replace_worker; however it stops, a node drained for a replace that was never requested is uncordoned
        again (kube/eviction.py), and this replacement's canary turn (pool_rules.py) ends."""
        run = _Run(self, props, start)
        error: Optional[BaseException] = None
        try:
            with explained():  # the drain's and the records' Kubernetes requests (kube/refusals.py)
                return self._replace_worker(props, start, run)
        except BaseException as e:
            error = e
            run.release_unrequested()
            raise
        finally:
            pool_rules.CANARIES.end(props["cluster"], run.claimant, error, requested=run.accepted, worker=run.worker,
                                    every_batch=PoolRules.from_props(props.get("pool_rules")).canary_every_batch,
                                    batch=pool_rules.batch_of(props))

    def _replace_worker(self, props: dict[str, Any], start: str, run: "_Run") -> dict[str, Any]:
        """Resumable: each poll reads the real worker state and takes the next step from there (_Run.poll).
        A worker this resource followed to is never replaced again, whatever fix pack IKS gave it."""
        cluster, target = props["cluster"], props["kube_version"]
        timeout, interval = self.timing(props, 5400)
        first = {w["id"]: w for w in run.client.list_workers(cluster, show_deleted=True)}.get(start)
        if first is not None and self._needs_replacement(first, target):
            # The gates (master, eviction) may take their own bounded time: not counted against the replace wait.
            run.drain(first)
        elif first is not None and is_deleting(first) and props.get("evict") and primary_ip(first):
            from ..kube import eviction  # resumed after its request: the drain's record is on the old node, if any
            run.drained = eviction.recorded(primary_ip(first), props["evict"])
        what = f"worker {start} of cluster {cluster} replaced at {target} (deployed, normal, Ready)"
        try:
            new = wait_for(what, run.poll, timeout, interval)
        except WaitTimeout as e:
            detail = (
                f"the replacement of worker {start} was requested (new worker: "
                f"{run.current if run.current != start else 'not visible yet'}); re-running `pulumi up` "
                f"resumes waiting without replacing it again"
                if run.requested or run.followed else f"worker {start} was not replaced; re-running `pulumi up` retries"
            )
            raise WaitTimeout(f"{e}; {detail}") from None
        actual = worker_version(new)
        if new["id"] != start:
            record_entry(props, primary_ip(new))
        if new["id"] in run.created and not version_at_least(actual, target):
            pulumi.log.warn(f"worker {new['id']} runs {actual}: IKS's newest worker fix pack, not the pinned "
                            f"kubeVersion {target}; it is not replaced again")
        return {
            # Of the inputs only what diff and read use: the rest (drain settings with the batch, timeouts, pool
            # rules) steers a run and is read from the new inputs; each copy is rewritten with every state save.
            **{k: v for k, v in _public(props).items() if k in KEPT_INPUTS},
            "old_worker_id": start,
            "new_worker_id": new["id"],
            "node_name": primary_ip(new) or props.get("node_name"),
            "actual_version": actual,
            # What the drain moved (read by `status`); a resumed replacement reads what the killed run recorded.
            "drained": compact_drain(run.drained),
        }

    @staticmethod
    def _needs_replacement(worker: dict, target: str) -> bool:
        return is_deployed(worker) and not is_deleting(worker) and not version_at_least(worker_version(worker), target)

    @staticmethod
    def _settled(worker: dict, streak: Streak) -> tuple[bool, Optional[dict], str]:
        done = streak.see(worker["id"], is_ready(worker))
        return done, worker, f"{describe_worker(worker)}; {streak.of(worker['id'])}"

    @staticmethod
    def _orphan(cur: dict, cluster: str, run: "_Run", grace: float) -> str:
        """The old worker is gone and no new one shows: with automatic rebalancing off IKS creates none."""
        state = f"{describe_worker(cur)}; its replacement is not visible yet"
        if not is_deleted(cur):
            return state
        run.orphaned_at = run.orphaned_at or time.monotonic()
        if time.monotonic() - run.orphaned_at > grace:
            pool = cur.get("poolName") or cur.get("poolID")
            raise ReplacementError(
                f"worker {cur['id']} of cluster {cluster} was deleted and no new worker appeared in its pool {pool} "
                f"(zone {cur.get('location')}) within {grace:.0f}s: automatic rebalancing of the pool looks off, "
                f"so IKS will not create the replacement. Rebalance the pool (`ibmcloud ks worker-pool rebalance "
                f"--cluster {cluster} --worker-pool {pool}`) and re-run `pulumi up`: it picks up the new worker"
            )
        return state

    def _before_replace(self, client: IksClient, props: dict[str, Any], worker: dict) -> Optional[dict]:
        """The gates every replaceWorker passes: another GPU node exists, the master rests at the target, and the
        node's workloads were moved off it (kube/eviction.py); returns what the drain moved, if it ran."""
        cluster = props["cluster"]
        if props.get("single_gpu_node"):
            raise ReplacementError(
                f"worker {worker['id']} is the only GPU node of cluster {cluster}: replacing it leaves GPU "
                f"workloads nowhere to run; enable gpu-migration:tempGpuPool (flavor, zone) first. "
                f"Nothing was replaced."
            )
        wait_master_at(client, cluster, props["kube_version"], props)
        pool_rules.check_pool(client, props, worker)  # rebalancing on, no autoscaler
        evict, drained = props.get("evict"), None
        if evict and primary_ip(worker):
            from ..kube import eviction  # kubernetes is only needed when a node is drained
            hold_for_budget(primary_ip(worker), evict)  # the capacity budget as it is now (kube/drain_budget.py)
            drained = eviction.drain(primary_ip(worker), evict)
        # The canary guards the request, not the drain: a batch's nodes drain together, as the budget lets them and as
        # GKE and EKS drain up to maxUnavailable nodes at once, so a batch pays one drain, not the canary's and then
        # its batch-mates'. If the canary stops, this node is uncordoned again (_Run.release_unrequested).
        pool_rules.CANARIES.wait_turn(props, worker)
        return drained

    @staticmethod
    def _request(client: IksClient, cluster: str, worker: dict, drained: Optional[str] = None,
                 evict: Optional[dict] = None) -> None:
        """A refused request (4xx) is an error naming the worker, unless the worker is in fact being replaced."""
        _log(f"replacing worker {worker['id']} of cluster {cluster} (update=true) from {worker_version(worker)}")
        try:
            client.replace_worker(cluster, worker["id"])
        except IksApiError as e:
            if not (e.status_code and 400 <= e.status_code < 500):
                note = (f"; node {drained} stays cordoned and drained, as IKS may have accepted the replace: "
                        f"re-running `pulumi up` resumes it, or `kubectl uncordon {drained}` if you give it up"
                        if drained else "")
                raise IksApiError(f"{e}{note}", e.status_code) from None
            after = client.get_worker(cluster, worker["id"])
            if after is not None and is_deleting(after):
                _log(f"worker {worker['id']} is already being replaced ({e})")
                return
            drain_note = f"; its node {drained} was drained before the request" if drained else ""
            if drained and evict:
                from ..kube import eviction
                drain_note += " and is uncordoned again" if eviction.release(drained, evict) else ""
            raise IksApiError(f"IKS refused the replacement, worker {worker['id']} is unchanged: {e}{drain_note}",
                              e.status_code) from None


class _Run:
    """One replacement's progress within this process: which worker it follows now and what it did.

    current worker created by this run, or at target -> wait until deployed/normal/Ready on several readings;
    current worker being deleted                      -> follow it to its replacement and keep waiting;
    current worker failed                             -> stop with IKS's message;
    current worker deployed, older                    -> gates (master, only GPU node, eviction), then request
                                                         replace(update=true) once, remembering the IDs seen.
    """

    def __init__(self, provider: WorkerReplacementProvider, props: dict[str, Any], start: str) -> None:
        self.provider, self.props, self.start = provider, props, start
        self.cluster, self.target = props["cluster"], props["kube_version"]
        self.client = provider.client(props)
        self.grace = optional_float(props.get("rebalance_timeout"), 900)
        self.others = frozenset(props.get("other_worker_ids") or []) - {start}
        self.claimant = f"{self.cluster}/{start}"
        self.streak = Streak(provider.readings(props))
        self.current: str = start
        self.known: Optional[set[str]] = None  # worker IDs seen right before this process requested the replacement
        self.requested: set[str] = set()
        self.followed: list[str] = []
        self.created: set[str] = set()
        self.prepared: set[str] = set()
        self.orphaned_at: Optional[float] = None
        self.drained: Optional[dict] = None  # what the drain moved off the node
        self.drained_nodes: dict[str, str] = {}  # worker ID -> node, drained (or drain started) by this process
        self.worker: Optional[dict] = None  # the old worker whose pool and zone this replacement is in (canaries)
        self.adopted = False  # following a replacement an earlier run requested

    @property
    def accepted(self) -> bool:
        """IKS accepted a replace of this replacement's worker (this run's request, or an earlier run's)."""
        return bool(self.requested or self.followed or self.adopted)

    def drain(self, worker: dict) -> None:
        """The gates before a replace (master, pool rules, budget, drain): run once per worker."""
        self.worker = self.worker or worker
        self.drained_nodes[worker["id"]] = primary_ip(worker) or ""
        self.drained = self.provider._before_replace(self.client, self.props, worker)
        self.prepared.add(worker["id"])

    def release_unrequested(self) -> None:
        """The run stops before a drained node's replace was requested: its drain's cordon is undone."""
        evict = self.props.get("evict")
        for worker_id, node in self.drained_nodes.items():
            if evict and node and worker_id not in self.requested:
                from ..kube import eviction
                eviction.release(node, evict)

    def poll(self) -> tuple[bool, Optional[dict], str]:
        workers = self.client.list_workers(self.cluster, show_deleted=True)
        claims.CLAIMS.observe(self.cluster, workers)
        by_id = {w["id"]: w for w in workers}
        cur = by_id.get(self.current)
        if cur is None:
            raise ReplacementError(
                f"worker {self.current} not found in cluster {self.cluster} (neither live nor deleted); "
                f"check workerId of node {self.props.get('node_name')} in gpu-migration:nodes"
            )
        if is_failed(cur):
            raise failed_worker_error(cur, self.cluster, self.followed[-1] if self.followed else self.start)
        if is_deleting(cur):
            cur = self._follow(cur, workers)
            if cur is None:
                return False, None, self.provider._orphan(by_id[self.current], self.cluster, self, self.grace)
        return self._step(cur, by_id)

    def _follow(self, cur: dict, workers: list[dict]) -> Optional[dict]:
        """The new worker that takes `cur`'s place, claimed for this replacement; None while none is visible."""
        resumed = self.known is None  # not requested by this process: its batch-mates' claims are unknown
        if resumed:  # IKS accepted an earlier run's request: this replacement counts as requested (CANARIES.end)
            self.worker, self.adopted = self.worker or cur, True
            pool_rules.CANARIES.adopt(self.cluster, self.claimant, cur)
        pool = self.client.get_worker_pool(self.cluster, cur.get("poolID")) if resumed else None
        recorded = recorded_by_other_entries(self.props) if resumed else {}
        configured, own = self.provider.entries(self.props), self.props.get("node_name")
        entries = current_workers(configured, recorded, workers)
        waiting = None
        if resumed and own in entries:
            claimed, pending = claims.CLAIMS.busy(self.cluster, self.claimant)
            zone = {w["id"] for w in workers
                    if w.get("poolID") == cur.get("poolID") and w.get("location") == cur.get("location")}
            if pending & zone:
                return None  # a batch-mate of this process requested its replacement: it claims its worker first
            live = {w["id"] for w in workers if not is_deleting(w)}
            waiting = waiting_entries(cur, workers, own, entries, {e for w, e in recorded.items() if w in live},
                                      claimed)
        others = self.others | frozenset(recorded) | claims.CLAIMS.taken(self.cluster, self.claimant)
        not_new = frozenset(w for m in (configured, entries) for e, w in m.items() if e != own)
        candidates = find_replacement(cur, workers, pool, self.target, self.known, others, waiting, own, not_new)
        new = claims.CLAIMS.claim(self.cluster, self.claimant, candidates)
        if new is None:
            return None
        if is_failed(new):  # never followed: IKS does not retry a failed worker by itself
            raise failed_worker_error(new, self.cluster, cur["id"])
        _log(f"worker {cur['id']} of cluster {self.cluster} is replaced by {new['id']}")
        self.followed.append(cur["id"])
        self.created.add(new["id"])
        self.current, self.known, self.orphaned_at = new["id"], None, None
        return new

    def _step(self, cur: dict, by_id: dict[str, dict]) -> tuple[bool, Optional[dict], str]:
        target = self.target
        if cur["id"] in self.created:
            if worker_version(cur) and not same_minor(worker_version(cur), target):
                raise ReplacementError(
                    f"IKS replaced worker {self.followed[-1]} of cluster {self.cluster} by {cur['id']} at "
                    f"{worker_version(cur)}, not at kubeVersion {target}; it is not replaced again. Check the "
                    f"master version (`ibmcloud ks cluster get --cluster {self.cluster}`) and re-run `pulumi up`"
                )
            return self.provider._settled(cur, self.streak)
        if version_at_least(worker_version(cur), target):
            return self.provider._settled(cur, self.streak)
        if cur["id"] in self.requested:
            return False, None, f"replacement requested, not started yet: {describe_worker(cur)}"
        if not is_deployed(cur):
            return False, None, describe_worker(cur)
        if cur["id"] not in self.prepared:
            self.drain(cur)
        self.known = set(by_id)
        self.requested.add(cur["id"])
        drained = primary_ip(cur) if self.props.get("evict") else None
        self.provider._request(self.client, self.cluster, cur, drained, self.props.get("evict"))
        claims.CLAIMS.requested(self.cluster, self.claimant, cur["id"])
        # Look again at once, not a poll interval later: IKS may show the new worker right away (and fail it: a
        # stock-out ends it in provision_failed). Once: the worker is now `requested`.
        done, new, state = self.poll()
        return done, new, state if done or self.current != cur["id"] else \
            f"replacement of worker {cur['id']} (update to {target}) requested"


class WorkerReplacement(dyn.Resource, module="gpu-migration", name="WorkerReplacement"):
    """`worker_id` replaced (update=true) by a worker at `kube_version`; resumes an interrupted replacement."""

    old_worker_id: pulumi.Output[str]
    new_worker_id: pulumi.Output[str]
    node_name: pulumi.Output[str]  # the new worker's Kubernetes node name (its primary private IP on VPC)
    kube_version: pulumi.Output[str]
    actual_version: pulumi.Output[str]
    drained: pulumi.Output[dict]  # what the drain before the replace moved: evicted, deleted, skipped, ... pods

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
        single_gpu_node: bool = False,
        evict: Optional[pulumi.Input[dict]] = None,
        pool_rules: Optional[pulumi.Input[dict]] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        """`other_worker_ids`: workers of the other GPU nodes (configured and replaced IDs); optional, it only helps
        tell this node's replacement apart from an already-migrated sibling when resuming.
        A resumed replacement pairs the new workers of its pool and zone with the config entries waiting there
        (claims.pair_new_workers): the entries come from the stack config the provider is configured with
        (`gpu-migration:nodes`, provider.py `entries`), not from an input, which every node would repeat.
        `evict`: kube/eviction.py settings (kubeconfig, timeout, poll_interval, gpu_nodes, gpu_resources); when set,
        the node is drained before each replaceWorker (with `drain`: kubectl drain's options); with `budget`
        (kube/drain_budget.py: index, batch, selector, min_available, timeout, poll_interval) the capacity budget is
        checked again first.
        `pool_rules`: {"allow_rebalancing_off": [pool names], "allow_autoscaling": [pool names]}, the stack config's
        workerPoolRules (pool_rules.py refuses those pools otherwise).
        Inputs at their default are left out: every input is stored per node, and its key once more in the state's
        propertyDependencies."""
        props = {"cluster": cluster, "worker_id": worker_id, "node_name": node_name, "kube_version": kube_version,
                 "api": api, "timeout": timeout, "poll_interval": poll_interval, "evict": evict,
                 "other_worker_ids": other_worker_ids or None, "single_gpu_node": single_gpu_node or None,
                 "pool_rules": pool_rules or None,
                 "old_worker_id": None, "new_worker_id": None, "actual_version": None, "drained": None}
        super().__init__(WorkerReplacementProvider(), name, props, opts)
