"""IKS's version and worker-pool rules, decided before the master or any worker is touched. Pure: plain values in,
a refusal message (or None) out; iks/master.py and iks/pool_rules.py read IKS and act on the answer.

Version skew: worker nodes may run at most two minor versions behind the master (n-2), for every worker pool of the
cluster, GPU or not; `ibmcloud ks cluster master update --force-update` overrides that (ibm-cloud-docs/containers
update.md "Updating the master", cs_versions.md). The program never forces: a master step that would leave a pool more
than two minors behind is refused before the first step (see docs/operations.md for why not interleaving).
The master takes `major.minor` only: IKS picks its patch, fix packs (`_NNNN`) are for workers (update.md#vpc_worker_node;
the master update is PUT /v1/clusters/{c} {"action": "update", "version": "1.36"}, /work/shared/reference/iks-api.md).

Pools: `worker replace` deletes the worker and the pool's automatic rebalancing creates the new one; "A replacement
worker node is not created if the worker pool does not have automatic rebalancing enabled" (auto-rebalance-off.md).
A pool the cluster autoscaler manages "can't [be resized or rebalanced]" by hand (cluster-scaling-install-addon-enable,
ConfigMap kube-system/iks-ca-configmap, key workerPoolsConfig.json).
"""
import json
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from ..common.versions import version_key

MAX_MINORS_BEHIND = 2  # IKS update.md: workers at most two minor versions behind the master


def master_version(version: str) -> str:
    """What the master is sent: `major.minor` ('1.37.0_1501' -> '1.37')."""
    parts = version_key(version)[:2]
    if len(parts) < 2:
        raise ValueError(f"{version!r} is not a Kubernetes version like 1.37 or 1.37.0_1501")
    return f"{parts[0]}.{parts[1]}"


def minor(version: Optional[str]) -> Optional[tuple[int, int]]:
    parts = version_key(version)[:2]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def master_above_target(cluster: str, master: Optional[str], target: str) -> Optional[str]:
    """A master whose major.minor is above the target's: IKS never downgrades a master, and replaced workers come up at
    the master's major.minor (update.md#vpc_worker_node), never at `target`. Refused before anything is drained."""
    have, want = minor(master), minor(target)
    if have is None or want is None or have <= want:
        return None
    return (f"the master of cluster {cluster} is at {master}, above kubeVersion {target}: IKS never downgrades a master "
            f"and a replaced worker comes up at the master's version ({have[0]}.{have[1]}), so no worker can reach "
            f"{target}. Set gpu-migration:kubeVersion to {have[0]}.{have[1]} (or later) and re-run `pulumi up`. "
            f"Nothing was drained or replaced")


def lowest_by_pool(workers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(pool name, worker version) pairs -> each pool's lowest version (versions that don't parse are skipped)."""
    lowest: dict[str, str] = {}
    for pool, version in workers:
        if minor(version) is None:
            continue
        if pool not in lowest or version_key(version) < version_key(lowest[pool]):
            lowest[pool] = version
    return lowest


def skew_refusal(cluster: str, master: Optional[str], steps: list[str], pools: Mapping[str, str]) -> Optional[str]:
    """None if every master step keeps every pool at most two minors behind, else the refusal naming the pools.

    `pools`: each worker pool's lowest worker version (lowest_by_pool). Checked against the last step: the program
    replaces no worker between master steps, so no pool moves in between."""
    if not steps:
        return None
    highest = max((minor(s) for s in steps if minor(s)), default=None)
    if highest is None:
        return None
    behind = {name: version for name, version in pools.items() if _too_far_behind(minor(version), highest)}
    if not behind:
        return None
    oldest = min(minor(v) for v in behind.values())
    reachable = f"{oldest[0]}.{oldest[1] + MAX_MINORS_BEHIND}"
    listed = ", ".join(f"{name} at {version}" for name, version in sorted(behind.items()))
    fix = (f"Update those pools' workers first (`ibmcloud ks worker replace --cluster {cluster} --worker <id> "
           f"--update`, one minor at a time), or set gpu-migration:kubeVersion to at most {reachable}, run `pulumi up` "
           f"and then raise it")
    return (f"IKS keeps worker nodes at most {MAX_MINORS_BEHIND} minor versions behind the master: updating the master "
            f"of cluster {cluster} from {master} to {'.'.join(map(str, highest))} would leave worker pool(s) {listed} "
            f"more than {MAX_MINORS_BEHIND} behind. {fix}. This program never uses --force-update. Nothing was updated")


def _too_far_behind(pool: Optional[tuple[int, int]], master: tuple[int, int]) -> bool:
    if pool is None or pool >= master:
        return False
    return pool[0] < master[0] or master[1] - pool[1] > MAX_MINORS_BEHIND


@dataclass(frozen=True)
class PoolRules:
    """Pools the stack config lets through although they break a rule (`workerPoolRules`), and whether each round of
    `slots` nodes proves its pool and zone with a canary again (`workerPoolRules.canary: everyBatch`; default once per
    run)."""
    allow_rebalancing_off: frozenset[str] = frozenset()
    allow_autoscaling: frozenset[str] = frozenset()
    canary_every_batch: bool = False

    @classmethod
    def from_props(cls, raw: Optional[Mapping]) -> "PoolRules":
        raw = raw or {}
        return cls(frozenset(raw.get("allow_rebalancing_off") or ()), frozenset(raw.get("allow_autoscaling") or ()),
                   raw.get("canary") == "everyBatch")


def autoscaled_pools(ca_config: Optional[str]) -> frozenset[str]:
    """Pool names (or IDs) the cluster autoscaler manages: entries of iks-ca-configmap's workerPoolsConfig.json with
    `"enabled": true` (cluster-scaling-install-addon-enable). Unreadable JSON manages nothing here: the API's
    autoscaleEnabled field still counts."""
    try:
        entries = json.loads(ca_config or "[]")
    except ValueError:
        return frozenset()
    return frozenset(str(e.get("name")) for e in entries if isinstance(e, dict) and e.get("enabled") is True)


def pool_refusal(cluster: str, worker_id: str, pool: Mapping, zone: str, rules: PoolRules,
                 ca_pools: frozenset[str] = frozenset()) -> Optional[str]:
    """None if `worker_id` of `pool` (getWorkerPool JSON) in `zone` may be replaced, else why not and the fix.

    Fields: `autoscaleEnabled` (pool) and `autobalanceEnabled` (per zone), container-services-go-sdk
    GetWorkerPoolResponse. A zone entry without `autobalanceEnabled` is taken as on (older answers lack it)."""
    name, pool_id = str(pool.get("poolName") or pool.get("id")), str(pool.get("id") or "")
    names = {name, pool_id} - {""}
    problems = []
    if (pool.get("autoscaleEnabled") or names & ca_pools) and not names & rules.allow_autoscaling:
        problems.append(
            f"the cluster autoscaler manages worker pool {name}, and IKS does not rebalance an autoscaled pool by hand, "
            f"so a replaced worker may not come back: disable autoscaling for the pool (set \"enabled\": false for "
            f"{name} in ConfigMap kube-system/iks-ca-configmap, workerPoolsConfig.json) for the migration, or list "
            f"{name} in gpu-migration:workerPoolRules.allowAutoscaling to replace anyway")
    zone_entry = next((z for z in pool.get("zones") or [] if z.get("id") == zone), {})
    if zone_entry.get("autobalanceEnabled") is False and not names & rules.allow_rebalancing_off:
        problems.append(
            f"automatic rebalancing is off for worker pool {name} in zone {zone}, and IKS creates no replacement "
            f"worker without it: run `ibmcloud ks worker-pool rebalance --cluster {cluster} --worker-pool {name}` "
            f"(it turns rebalancing back on), or list {name} in gpu-migration:workerPoolRules.allowRebalancingOff if "
            f"you add the workers yourself")
    if not problems:
        return None
    return f"worker {worker_id} of cluster {cluster} was not replaced (nothing was drained): " + "; ".join(problems)


# What getCluster says of the cluster's kind (IBM-Cloud/bluemix-go api/container/containerv2/clusters.go ClusterInfo
# `provider`, `type`; providers "vpc-gen2", "vpc-classic", "satellite", and "classic" for classic infrastructure;
# containerv1/clusters.go tells a Red Hat OpenShift cluster by `type == "openshift"`, whose masterKubeVersion also
# ends in "_openshift"). The program is written for IKS on VPC Gen 2 only.
SUPPORTED_PROVIDER = "vpc-gen2"


def cluster_kind_refusal(cluster: str, info: Mapping) -> Optional[str]:
    """None if IKS cluster `cluster` (its getCluster JSON) is one the program can migrate, else what differs and
    that nothing was changed. A field IKS leaves out is not held against the cluster."""
    problems = []
    if info.get("type") == "openshift" or str(info.get("masterKubeVersion") or "").endswith("_openshift"):
        problems.append("it is a Red Hat OpenShift on IBM Cloud cluster: its workers may be at most one minor "
                        "version behind the master, its GPU Operator comes through OLM (not this program's Helm "
                        "release), and bare-metal workers are reloaded, not replaced")
    provider = info.get("provider")
    if provider and provider != SUPPORTED_PROVIDER:
        what = {"classic": "classic infrastructure: workers are replaced with POST /v2/replaceWorker and rebuilt "
                           "without a worker pool's VPC rebalancing"}.get(provider, "not on VPC Gen 2")
        problems.append(f"its provider is {provider!r} ({what}); the program replaces workers the IKS VPC way "
                        f"(/v2/vpc/replaceWorker, pool rebalancing) and only on {SUPPORTED_PROVIDER!r}")
    if not problems:
        return None
    return (f"IKS cluster {cluster} (gpu-migration:clusterName) is not a cluster this program can migrate: "
            f"{'; '.join(problems)}. Nothing was changed")
