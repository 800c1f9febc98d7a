"""Dynamic providers for the IKS side of the migration: master version, worker replacement, temporary GPU pool.

Providers are pickled by dill into the state, so they hold no clients: each operation builds its own IksClient.
The API key comes from the `api` input (a Pulumi secret), else the stack config gpu-migration:ibmApiKey (seen by the
provider's `configure`, which is what `delete` relies on: outputs never hold the key), else IC_API_KEY.
"""
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from .iks_api import (
    API_KEY_CONFIG,
    IksClient,
    IksApiError,
    describe_worker,
    is_deleting,
    is_deployed,
    is_ready,
    primary_ip,
    worker_version,
)
from .versions import minor_steps, version_at_least
from .waiting import WaitTimeout, optional_float, wait_for


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
        """Step the master up one minor version at a time to `version`, waiting for deployed/normal after each."""
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
            info = self._update_to(client, cluster, step, info, props)
        return {**_public(props), "actual_version": info.get("masterKubeVersion")}

    def _update_to(self, client: IksClient, cluster: str, target: str, info: dict, props: dict[str, Any]) -> dict:
        """Request the update to `target` if the master is below it (unless one is running); wait until done."""
        timeout, interval = self.timing(props, 3600)
        life = info.get("lifecycle") or {}
        if not version_at_least(info.get("masterKubeVersion"), target):
            if version_at_least(info.get("targetVersion"), target) and life.get("masterState") != "deployed":
                _log(f"master of cluster {cluster} is already updating to {info.get('targetVersion')}")
            else:
                _log(f"master of cluster {cluster} is {info.get('masterKubeVersion')}; requesting update to {target}")
                client.update_master(cluster, target)

        def poll() -> tuple[bool, dict, str]:
            now = client.get_cluster(cluster)
            life = now.get("lifecycle") or {}
            done = (
                version_at_least(now.get("masterKubeVersion"), target)
                and life.get("masterState") == "deployed"
                and life.get("masterHealth") == "normal"
            )
            state = (f"master {now.get('masterKubeVersion')} {life.get('masterState')}/{life.get('masterHealth')}"
                     f" ({life.get('masterStatus')})")
            return done, now, state

        return wait_for(f"master of cluster {cluster} at {target} (deployed, normal)", poll, timeout, interval)


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

def find_replacement(
    old: dict, workers: list[dict], pool: Optional[dict], target: str, known: Optional[set[str]],
    others: frozenset[str] = frozenset(),
) -> Optional[dict]:
    """The worker that replaces `old` (same pool and zone), or None if it is not visible yet.

    `known`: worker IDs seen just before we requested the replacement (then the new one is simply the new ID).
    Without it (resuming a replacement requested by an earlier run) the replacement is the one sibling still
    provisioning, else the one sibling at the target version once the zone is back to its size; `others` (workers
    of other nodes) are never candidates. Anything else is ambiguous and raises instead of guessing.
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
        return None  # the replacement has not been created yet
    siblings = [w for w in siblings if w["id"] not in others]
    if known is not None:
        candidates = [w for w in siblings if w["id"] not in known]
    else:
        in_flight = [w for w in siblings if not is_deployed(w)]
        candidates = in_flight or [w for w in siblings if version_at_least(worker_version(w), target)]
    if len(candidates) > 1:
        raise ReplacementError(
            f"worker {old['id']} was replaced but its replacement is ambiguous "
            f"({', '.join(w['id'] for w in candidates)}); set workerId of this node in gpu-migration:nodes to the "
            f"new worker's ID and re-run `pulumi up` (it will not be replaced again)"
        )
    return candidates[0] if candidates else None


class WorkerReplacementProvider(_IksProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        return dyn.CreateResult(props["worker_id"], self._replace(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        """Only another cluster, another kube version or a worker other than the recorded old/new one replaces."""
        recorded = {olds.get("old_worker_id"), olds.get("new_worker_id"), olds.get("worker_id")}
        replaces = [k for k in ("cluster", "kube_version") if olds.get(k) != news.get(k)]
        if news.get("worker_id") not in recorded:
            replaces.append("worker_id")
        return dyn.DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        # Not reached through diff (it never reports an in-place change); keeps the recorded result if it is.
        recorded = {k: olds.get(k) for k in ("old_worker_id", "new_worker_id", "node_name", "actual_version")}
        return dyn.UpdateResult({**_public(news), **recorded})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _log(f"worker replacement {props.get('old_worker_id')} -> {props.get('new_worker_id')}: "
             f"nothing to delete (a replaced worker cannot be un-replaced)")

    def _replace(self, props: dict[str, Any]) -> dict[str, Any]:
        """Resumable: each poll reads the real worker state and takes the next step from there.

        current worker at target version -> wait until deployed/normal/Ready (no replacement);
        current worker being deleted     -> follow it to its replacement and keep waiting;
        current worker deployed, older   -> request replace(update=true) once, remember the IDs seen before.
        """
        cluster, worker_id, target = props["cluster"], props["worker_id"], props["kube_version"]
        timeout, interval = self.timing(props, 5400)
        client = self.client(props)
        others = frozenset(props.get("other_worker_ids") or []) - {worker_id}
        st: dict[str, Any] = {"current": worker_id, "known": None, "requested": set(), "followed": []}

        def poll() -> tuple[bool, Optional[dict], str]:
            workers = client.list_workers(cluster, show_deleted=True)
            by_id = {w["id"]: w for w in workers}
            cur = by_id.get(st["current"])
            if cur is None:
                raise ReplacementError(
                    f"worker {st['current']} not found in cluster {cluster} (neither live nor deleted); "
                    f"check workerId of node {props.get('node_name')} in gpu-migration:nodes"
                )
            if is_deleting(cur):
                pool = None if st["known"] is not None else client.get_worker_pool(cluster, cur.get("poolID"))
                new = find_replacement(cur, workers, pool, target, st["known"], others)
                if new is None:
                    return False, None, f"{describe_worker(cur)}; its replacement is not visible yet"
                _log(f"worker {cur['id']} of cluster {cluster} is replaced by {new['id']}")
                st["followed"].append(cur["id"])
                st.update(current=new["id"], known=None)
                cur = new
            if version_at_least(worker_version(cur), target):
                return is_ready(cur), cur, describe_worker(cur)
            if is_deployed(cur) and cur["id"] not in st["requested"]:
                if props.get("single_gpu_node"):
                    raise ReplacementError(
                        f"worker {cur['id']} is the only GPU node of cluster {cluster}: replacing it leaves GPU "
                        f"workloads nowhere to run; enable gpu-migration:tempGpuPool (flavor, zone) first. "
                        f"Nothing was replaced."
                    )
                st["known"] = set(by_id)
                st["requested"].add(cur["id"])
                self._request(client, cluster, cur)
                return False, None, f"replacement of worker {cur['id']} (update to {target}) requested"
            if cur["id"] in st["requested"]:
                return False, None, f"replacement requested, not started yet: {describe_worker(cur)}"
            return False, None, describe_worker(cur)

        what = f"worker {worker_id} of cluster {cluster} replaced at {target} (deployed, normal, Ready)"
        try:
            new = wait_for(what, poll, timeout, interval)
        except WaitTimeout as e:
            started = st["requested"] or st["followed"]
            detail = (
                f"the replacement of worker {worker_id} was requested (new worker: "
                f"{st['current'] if st['current'] != worker_id else 'not visible yet'}); re-running `pulumi up` "
                f"resumes waiting without replacing it again"
                if started else f"worker {worker_id} was not replaced; re-running `pulumi up` retries"
            )
            raise WaitTimeout(f"{e}; {detail}") from None
        return {
            **_public(props),
            "old_worker_id": worker_id,
            "new_worker_id": new["id"],
            "node_name": primary_ip(new) or props.get("node_name"),
            "actual_version": worker_version(new),
        }

    @staticmethod
    def _request(client: IksClient, cluster: str, worker: dict) -> None:
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
            raise IksApiError(f"IKS refused the replacement, worker {worker['id']} is unchanged: {e}",
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
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        """`other_worker_ids`: workers of the other GPU nodes (configured and replaced IDs); optional, it only helps
        tell this node's replacement apart from an already-migrated sibling when resuming."""
        props = {"cluster": cluster, "worker_id": worker_id, "node_name": node_name, "kube_version": kube_version,
                 "api": api, "timeout": timeout, "poll_interval": poll_interval,
                 "other_worker_ids": other_worker_ids or [], "single_gpu_node": single_gpu_node,
                 "old_worker_id": None, "new_worker_id": None, "actual_version": None}
        super().__init__(WorkerReplacementProvider(), name, props, opts)


# 3. Temporary GPU worker pool ----------------------------------------------------------------------------------

_POOL_SHAPE = ("cluster", "pool_name", "flavor", "zone", "vpc_id", "subnet_id", "size_per_zone")


class TempGpuPoolProvider(_IksProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        cluster, name = props["cluster"], props["pool_name"]
        timeout, interval = self.timing(props, 3600)
        client = self.client(props)
        pool = client.get_worker_pool(cluster, name)
        if pool is not None:
            _log(f"worker pool {name} already exists in cluster {cluster}; adopting it")
            if pool.get("flavor") and pool["flavor"] != props["flavor"]:
                pulumi.log.warn(f"adopted worker pool {name} has flavor {pool['flavor']}, not {props['flavor']}")
        else:
            _log(f"creating worker pool {name} ({props['flavor']} x{props['size_per_zone']} in {props['zone']})")
            client.create_worker_pool(cluster, name, props["flavor"], props["vpc_id"], props["zone"],
                                      props["subnet_id"], int(props["size_per_zone"]))
            pool = client.get_worker_pool(cluster, name) or {}
        size = int(props["size_per_zone"])

        def poll() -> tuple[bool, list[dict], str]:
            workers = [w for w in client.list_workers(cluster, pool=name) if not is_deleting(w)]
            ready = [w for w in workers if is_ready(w)]
            state = f"{len(ready)}/{size} ready: " + ("; ".join(describe_worker(w) for w in workers) or "no workers")
            return len(ready) >= size, ready, state

        ready = wait_for(f"workers of pool {name} in cluster {cluster} (deployed, normal, Ready)",
                         poll, timeout, interval)
        return dyn.CreateResult(pool.get("id") or name, {
            **_public(props),
            "pool_id": pool.get("id") or name,
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
        _log(f"removing worker pool {name} from cluster {cluster}")
        client.remove_worker_pool(cluster, name)

        def poll() -> tuple[bool, None, str]:
            pool = client.get_worker_pool(cluster, name)
            state = "gone" if pool is None else f"pool {(pool.get('lifecycle') or {}).get('actualState', 'present')}"
            return pool is None, None, state

        wait_for(f"worker pool {name} of cluster {cluster} removed", poll, timeout, interval)


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
