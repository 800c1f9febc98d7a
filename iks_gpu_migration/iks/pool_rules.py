"""The worker-pool rules every replaceWorker passes (called once from WorkerReplacementProvider._before_replace): the
pool must rebuild the worker (rebalancing on, no autoscaler: plan/iks_rules.py decides; checked before the node is
drained), and per pool and zone the run's first replacement, its canary, must bring its new worker to deployed with
its node Ready before any other replaceWorker in that pool and zone is sent (checked after the batch-mates' drains,
which run beside the canary's: a batch pays one drain).

Why a canary: IKS replaces concurrent requests concurrently ("If you replace multiple worker nodes at the same time,
they are deleted and replaced concurrently", update.md), and replaceWorker deletes the old worker before the new one
is provisioned. A GPU flavor out of stock in a zone shows the new worker `provision_pending`, then ends it in
`provision_failed` (ibm-cloud-docs worker-node-state-reference): had the batch-mates' requests gone when the new
worker was merely listed, every one of their old workers would be gone too. With the canary, a stock-out costs the
canary's node alone.

The canaries are kept per provider process like the claims (every dynamic resource of a stack is served by one
provider host process, claims.py), so "proven" lasts one `pulumi up`; a resumed `up` proves each pool and zone again.
A replacement resumed by a new process (its request was made by an earlier run) becomes the canary of its pool and
zone when it follows its deleted worker; a batch-mate that reaches the gate before that first poll is not held back.
"""
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi

from ..common.waiting import WaitTimeout, sleep_until, wait_for
from ..plan import iks_rules
from .api import IksClient
from .provider import ReplacementError, _IksProvider, _log

CA_CONFIGMAP = ("kube-system", "iks-ca-configmap")  # the cluster autoscaler add-on's config
CA_POOLS_KEY = "workerPoolsConfig.json"


def check_pool(client: IksClient, props: dict[str, Any], worker: dict) -> None:
    """Refuse a pool that cannot rebuild the worker (before anything is drained)."""
    cluster = props["cluster"]
    pool = client.get_worker_pool(cluster, worker.get("poolID") or worker.get("poolName"))
    if pool is None:
        raise ReplacementError(f"worker pool {worker.get('poolName') or worker.get('poolID')} of worker {worker['id']} "
                               f"was not found in cluster {cluster}; nothing was replaced")
    refusal = iks_rules.pool_refusal(cluster, worker["id"], pool, worker.get("location") or "",
                                     iks_rules.PoolRules.from_props(props.get("pool_rules")),
                                     autoscaler_pools(props))
    if refusal:
        raise ReplacementError(refusal)


def autoscaler_pools(props: dict[str, Any]) -> frozenset[str]:
    """Pools enabled in the autoscaler's ConfigMap, read through the eviction settings' kubeconfig (none: not read,
    the API's autoscaleEnabled still counts). No ConfigMap: the add-on is not installed."""
    evict = props.get("evict")
    if not evict:
        return frozenset()
    from kubernetes import client as k8s  # kubernetes is only needed when nodes are drained
    from kubernetes.client.exceptions import ApiException

    from ..kube.clients import api_client
    namespace, name = CA_CONFIGMAP
    with api_client(evict.get("kubeconfig")) as api:
        try:
            cm = k8s.CoreV1Api(api).read_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return frozenset()
            if e.status == 403:  # the kubeconfig may not read kube-system: the API's autoscaleEnabled still counts
                pulumi.log.warn(f"cannot read ConfigMap {namespace}/{name} (HTTP 403): which pools the cluster "
                                f"autoscaler manages is taken from IKS's autoscaleEnabled alone (the Role "
                                f"gpu-migration-autoscaler-config in rbac/gpu-migration.yaml grants the read)")
                return frozenset()
            raise ReplacementError(f"reading ConfigMap {namespace}/{name} (which pools the cluster autoscaler "
                                   f"manages) failed: HTTP {e.status} {e.reason}; nothing was replaced") from None
    return iks_rules.autoscaled_pools((cm.data or {}).get(CA_POOLS_KEY))


def batch_of(props: dict[str, Any]) -> Any:
    """The round of a replacement (the set of slots it started in: components/migration.py drain_budgets; before
    slots, its batch index); None without a budget."""
    budget = (props.get("evict") or {}).get("budget") or {}
    return budget.get("round", budget.get("index"))


def canary_timeout(props: dict[str, Any]) -> float:
    """A batch-mate waits as long as the canary may take to show its new worker: its budget re-check, its drain
    (waitForCompletion, then the evictions) and its replace."""
    evict = props.get("evict") or {}
    waits = [_IksProvider.timing(props, 5400)[0], evict.get("timeout") or 0,
             (evict.get("budget") or {}).get("timeout") or 0,
             ((evict.get("drain") or {}).get("wait_for_completion") or {}).get("timeout") or 0]
    return float(sum(float(w) for w in waits))


@dataclass
class _Group:
    """One (cluster, pool, zone) in this provider process."""
    pool: str
    canary: Optional[str] = None  # claimant (cluster/old worker ID) whose replacement is the canary now
    worker: str = ""  # the canary's old worker
    # Whom a replacement that reached deployed and Ready here proved it for: None, the rest of the run
    # (workerPoolRules.canary: once); else the batch index it proved (everyBatch).
    proven: set = field(default_factory=set)
    failed: Optional[str] = None  # why a requested replacement here stopped: no further request goes


class Canaries:
    """The canary replacement of each (cluster, pool, zone) in this provider process.

    Proof is a new worker deployed with its node Ready (the canary's whole replacement returned, several healthy
    readings), not a new worker merely listed: a GPU flavor out of stock shows its new worker `provision_pending`,
    then `provision_failed` (ibm-cloud-docs worker-node-state-reference), and by then every old worker whose replace
    went out is gone. Once proven, a group lets later replacements of this run go without waiting (`every_batch`:
    each batch's first replacement there proves it again). Any replacement of the group that stops after its request
    closes the group for the rest of the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str, str], _Group] = {}
        # Batch-mates wait on this, not on a poll interval: the canary's news is this process's own (end).
        self._changed = threading.Condition(self._lock)
        self._generation = 0

    def _notify(self) -> None:
        """Under the lock: a canary proved its group, stopped, or a group closed."""
        self._generation += 1
        self._changed.notify_all()

    @staticmethod
    def group(cluster: str, worker: dict) -> tuple[str, str, str]:
        return cluster, str(worker.get("poolID") or worker.get("poolName")), str(worker.get("location"))

    def _admit(self, key: tuple[str, str, str], claimant: str, worker: dict, batch: Any = None
               ) -> Optional[_Group]:
        """Under the lock. None: go (this is the canary, or the group is proven for the run or for `batch`); else
        the group to wait on (the caller raises if it failed)."""
        group = self._groups.setdefault(key, _Group(str(worker.get("poolName") or key[1])))
        if group.failed:
            return group
        proven = bool({None, batch} & group.proven)
        if group.canary is None and not proven:
            group.canary, group.worker = claimant, worker["id"]
        return None if group.canary == claimant or proven else group

    def turn(self, cluster: str, worker: dict, batch: Any = None) -> Optional[str]:
        """Without waiting: None if `worker` (of batch `batch`) may be requested now, else what it waits for; raises
        ReplacementError if a replacement of its pool and zone stopped after its request (the group is closed)."""
        key, claimant = self.group(cluster, worker), f"{cluster}/{worker['id']}"
        with self._lock:
            group = self._admit(key, claimant, worker, batch)
        if group is None:
            return None
        where = f"worker pool {group.pool}, zone {key[2]}"
        if group.failed:
            raise ReplacementError(
                f"worker {worker['id']} of cluster {cluster} was not replaced (its node, if drained, is uncordoned "
                f"again): in {where} a replacement of this run stopped after IKS accepted it, so no further "
                f"replaceWorker goes there: {group.failed}. Fix that and re-run `pulumi up`")
        return f"the canary of {where} (worker {group.worker}) to bring its new worker to deployed and Ready"

    def wait_turn(self, props: dict[str, Any], worker: dict) -> None:
        """Before `worker`'s replaceWorker: go if its pool and zone is proven or this is its canary, else wait for
        the canary's outcome (woken by it); raise if a replacement there stopped after its request."""
        cluster, batch = props["cluster"], batch_of(props)
        awaited = self.turn(cluster, worker, batch)
        if awaited is None:
            return
        _log(f"worker {worker['id']} waits for {awaited} first")
        seen = [self._generation]

        def poll() -> tuple[bool, None, str]:
            seen[0] = self._generation
            return self.turn(cluster, worker, batch) is None, None, "its new worker is not deployed and Ready yet"

        try:
            wait_for(f"{awaited} before worker {worker['id']} is replaced", poll, canary_timeout(props),
                     _IksProvider.timing(props, 5400)[1],
                     sleep=lambda seconds: sleep_until(lambda: self._generation != seen[0], self._changed, seconds))
        except WaitTimeout as e:
            raise ReplacementError(f"{e}; worker {worker['id']} was not replaced (its node, if drained, is uncordoned "
                                   f"again). Check the canary's replacement above; re-running `pulumi up` retries"
                                   ) from None

    def adopt(self, cluster: str, claimant: str, worker: dict) -> None:
        """A replacement requested by an earlier run, followed by this process: the canary if there is none."""
        with self._lock:
            self._admit(self.group(cluster, worker), claimant, worker)

    def end(self, cluster: str, claimant: str, error: Optional[BaseException], requested: bool = True,
            worker: Optional[dict] = None, every_batch: bool = False, batch: Any = None) -> None:
        """The replacement `claimant` (of `worker`, its old worker; of batch `batch`) returned (error None) or
        stopped.

        The canary's success proves its group for the run (`every_batch`: for its batch only, the next batch's first
        replacement there is a canary again). Any
        replacement of the group that stops after IKS accepted its replace closes the group: its new worker failed,
        never showed or never got Ready, so the pool and zone may not bring workers back. One that stopped before its
        request (its drain refused, its budget not met) says nothing about the pool: a canary's turn passes on."""
        why = f"worker {claimant.split('/', 1)[1]}: {error or type(error).__name__}"
        with self._lock:
            keys = [self.group(cluster, worker)] if worker else \
                [k for k, g in self._groups.items() if k[0] == cluster and g.canary == claimant]
            for key in keys:
                group = self._groups.get(key)
                if group is None:
                    continue
                if error is not None and requested:
                    group.failed = group.failed or why
                elif group.canary == claimant:
                    if error is None:
                        group.proven.add(batch if every_batch else None)
                    group.canary = None
                self._notify()


CANARIES = Canaries()
