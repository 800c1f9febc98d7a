"""TempGpuPool: a temporary VPC GPU worker pool, ready before the first replacement, removed when disabled."""
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from ..common.waiting import wait_for
from .api import IksApiError, IksClient
from .provider import Streak, _IksProvider, _log, _public
from .workers import describe_worker, failure_message, is_deleted, is_deleting, is_failed, is_ready, primary_ip


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
