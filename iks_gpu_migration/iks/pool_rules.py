"""The worker-pool rules every replaceWorker passes (called once from WorkerReplacementProvider._before_replace): the
pool must rebuild the worker (rebalancing on, no autoscaler: plan/iks_rules.py decides; checked before the node is
drained), and per pool and zone one canary replacement must show its new worker before its batch-mates in that pool
and zone are requested (checked after their drains, which run beside the canary's: a batch pays one drain).

Why a canary: IKS replaces concurrent requests concurrently ("If you replace multiple worker nodes at the same time,
they are deleted and replaced concurrently", update.md), so a pool and zone that cannot bring a worker back (no
capacity for the flavor, rebalancing that does not take) would lose every node of the batch at once. "Shows its new
worker" = the new worker is visible in IKS (the canary's replacement claimed it, claims.py), not necessarily Ready.

The canaries are kept per provider process like the claims (every dynamic resource of a stack is served by one
provider host process, claims.py). A canary lives while its replacement runs: batches run one after the other
(components/rollout.py), so each batch's first replacement in a pool and zone is that batch's canary. A replacement
resumed by a new process (its request was made by an earlier run) becomes the canary of its pool and zone when it
follows its deleted worker; a batch-mate that reaches the gate before that first poll is not held back by it.
"""
import threading
from dataclasses import dataclass
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


def canary_timeout(props: dict[str, Any]) -> float:
    """A batch-mate waits as long as the canary may take to show its new worker: its budget re-check, its drain
    (waitForCompletion, then the evictions) and its replace."""
    evict = props.get("evict") or {}
    waits = [_IksProvider.timing(props, 5400)[0], evict.get("timeout") or 0,
             (evict.get("budget") or {}).get("timeout") or 0,
             ((evict.get("drain") or {}).get("wait_for_completion") or {}).get("timeout") or 0]
    return float(sum(float(w) for w in waits))


@dataclass
class _Canary:
    claimant: str  # cluster/old worker ID, as claims.py names a replacement
    worker: str
    pool: str
    shown: bool = False
    failed: Optional[str] = None


class Canaries:
    """The canary replacement of each (cluster, pool, zone) in this provider process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_group: dict[tuple[str, str, str], _Canary] = {}
        # Batch-mates wait on this, not on a poll interval: the canary's news is this process's own (shown, end).
        self._changed = threading.Condition(self._lock)
        self._generation = 0

    def _notify(self) -> None:
        """Under the lock: a canary showed its new worker, or ended."""
        self._generation += 1
        self._changed.notify_all()

    @staticmethod
    def group(cluster: str, worker: dict) -> tuple[str, str, str]:
        return cluster, str(worker.get("poolID") or worker.get("poolName")), str(worker.get("location"))

    def _admit(self, key: tuple[str, str, str], claimant: str, worker: dict) -> Optional[_Canary]:
        """None: go (this is the canary, or the canary showed its new worker); else the canary to wait for."""
        with self._lock:
            canary = self._by_group.get(key)
            if canary is None:
                self._by_group[key] = _Canary(claimant, worker["id"], str(worker.get("poolName") or key[1]))
                return None
            return None if canary.claimant == claimant or canary.shown else canary

    def wait_turn(self, props: dict[str, Any], worker: dict) -> None:
        cluster = props["cluster"]
        key, claimant = self.group(cluster, worker), f"{cluster}/{worker['id']}"
        canary = self._admit(key, claimant, worker)
        if canary is None:
            return
        timeout, interval = canary_timeout(props), _IksProvider.timing(props, 5400)[1]
        where = f"worker pool {canary.pool}, zone {key[2]}"
        _log(f"worker {worker['id']} waits for the canary of {where}: worker {canary.worker}'s replacement must show "
             f"its new worker first")

        seen = [self._generation]

        def poll() -> tuple[bool, None, str]:
            with self._lock:
                seen[0] = self._generation
                current = self._by_group.get(key)
            if current is not None and current.failed:
                raise ReplacementError(
                    f"worker {worker['id']} of cluster {cluster} was not replaced (its node, if drained, is uncordoned "
                    f"again): the canary of {where}, worker {current.worker}, stopped before its new worker appeared: "
                    f"{current.failed}. Fix that and re-run `pulumi up`")
            done = current is None or current.shown or current.claimant == claimant
            return done, None, f"canary worker {canary.worker}: new worker not visible yet"

        try:
            wait_for(f"the canary of {where} (worker {canary.worker}) to show its new worker before worker "
                     f"{worker['id']} is replaced", poll, timeout, interval,
                     sleep=lambda seconds: sleep_until(lambda: self._generation != seen[0], self._changed, seconds))
        except WaitTimeout as e:
            raise ReplacementError(f"{e}; worker {worker['id']} was not replaced (its node, if drained, is uncordoned "
                                   f"again). Check the canary's replacement above; re-running `pulumi up` retries"
                                   ) from None
        self._admit(key, claimant, worker)  # the canary finished meanwhile: this one may be the next group's

    def adopt(self, cluster: str, claimant: str, worker: dict) -> None:
        """A replacement requested by an earlier run, followed by this process: the canary if there is none."""
        self._admit(self.group(cluster, worker), claimant, worker)

    def shown(self, cluster: str, claimant: str) -> None:
        with self._lock:
            for key, canary in self._by_group.items():
                if key[0] == cluster and canary.claimant == claimant:
                    canary.shown = True
                    self._notify()

    def end(self, cluster: str, claimant: str, error: Optional[BaseException], requested: bool = True) -> None:
        """The replacement `claimant` returned (error None) or stopped: a canary whose replace IKS accepted but that
        never showed its new worker stops its batch-mates (the pool and zone may not rebuild workers). One that
        stopped before its request (e.g. its drain was refused) says nothing about the pool: the group is freed
        and the next batch-mate becomes the canary."""
        with self._lock:
            for key, canary in list(self._by_group.items()):
                if key[0] != cluster or canary.claimant != claimant:
                    continue
                if error is not None and requested and not canary.shown:
                    canary.failed = str(error) or type(error).__name__
                else:
                    del self._by_group[key]
                self._notify()


CANARIES = Canaries()
