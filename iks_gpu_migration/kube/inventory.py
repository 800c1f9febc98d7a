"""GpuNodeInventory: every GPU node of the cluster is listed in gpu-migration:nodes and every entry has its node,
checked before anything is changed (never the GPU Operator next to IBM's drivers on a node the config forgot)."""
from dataclasses import dataclass, field
from typing import Optional

import pulumi
from kubernetes import client
from kubernetes.client import ApiClient
from pulumi.dynamic import Resource

from ..common.versions import version_at_least
from ..plan.gates import IKS_FLAVOR_LABEL, IKS_POOL_LABEL, gpu_hints
from .cluster import GPU_RESOURCE
from . import permissions
from .provider import CheckFailed, _bullets, _EveryUp
from .cordon import CORDON_ANNOTATION
from .records import CONFIG_NAME_ANNOTATION


# IKS labels every worker node with its worker ID (read back by IBM's cloud provider: IBM-Cloud/cloud-provider-ibm
# ibm/ibm_metadata_service.go, workerIDLabel) and its worker pool (ibm-cloud.kubernetes.io/worker-pool-name, IBM
# Cloud docs "Adding labels and taints to worker nodes"); its flavor and GPU labels: plan/gates.py.


IKS_WORKER_ID_LABEL = "ibm-cloud.kubernetes.io/worker-id"


IKS_ZONE_LABEL = "ibm-cloud.kubernetes.io/zone"


ZONE_LABEL = "topology.kubernetes.io/zone"  # well-known label (kubernetes.io/docs/reference/labels-annotations-taints)


def is_gpu_node(node: client.V1Node) -> bool:
    """nvidia.com/gpu capacity (IBM's or the operator's device plugin), IKS's or the operator's GPU label, or a GPU
    flavor (plan.gpu_hints)."""
    capacity = {**((node.status and node.status.capacity) or {}), **((node.status and node.status.allocatable) or {})}
    return bool(gpu_hints(node.metadata.labels or {}, GPU_RESOURCE in capacity))


@dataclass
class Inventory:
    problems: list[str]
    warnings: list[str]
    # config name -> {"pool", "zone"} of its node, from this run and every earlier one (kept in the check's state):
    # the evidence that lets a later run tell "its worker is being replaced" from "this name is wrong".
    seen: dict[str, dict[str, str]]
    # Entries whose node is gone since an earlier run saw it: their replacement was requested and resumes.
    resuming: list[str] = field(default_factory=list)


def _place(labels: dict[str, str]) -> dict[str, str]:
    return {"pool": labels.get(IKS_POOL_LABEL, ""), "zone": labels.get(ZONE_LABEL) or labels.get(IKS_ZONE_LABEL, "")}


def inventory(
    api: ApiClient, configured: dict[str, str], worker_ids: dict[str, str], operator_min_version: str,
    temp_pool: Optional[str] = None, seen: Optional[dict[str, dict[str, str]]] = None,
    worker_pools: Optional[list[str]] = None,
) -> Inventory:
    """Compares the cluster's GPU nodes with gpu-migration:nodes (`configured`: name -> stage, `worker_ids`: worker
    ID -> config name); `seen`: the pool and zone of each entry's node as earlier runs found them.

    Every GPU node must belong to an entry (by name, IKS worker ID, or the annotation the readiness step sets on a
    replaced node), and every entry must have a node. Two cases are explained by a replacement this program started
    and an interruption cut short, and so only warn: an entry past `ibm-managed` whose node an earlier run saw but is
    gone now (its worker is being replaced), paired one-to-one with an unlisted GPU node at or past
    operator_min_version in the same worker pool and zone (its new worker, not yet tied to the entry). Everything
    else is a problem that names the node: an unlisted GPU node on IBM's drivers (it would get the GPU Operator next
    to them), any other unlisted GPU node, an `ibm-managed` entry with no node (its node would stay unfenced), and an
    entry with no node that no run ever saw (a wrong name).

    `worker_pools` (gpu-migration:workerPools, a fleet split over several stacks): only the GPU nodes of these pools
    must be listed (the other stacks list the rest), and a listed node of another pool is a problem."""
    seen = dict(seen or {})
    problems, warnings = [], []
    unlisted: list[client.V1Node] = []
    now: dict[str, dict[str, str]] = {}
    for n in client.CoreV1Api(api).list_node().items:
        labels, annotations = n.metadata.labels or {}, n.metadata.annotations or {}
        name = n.metadata.name
        owner = (name if name in configured else worker_ids.get(labels.get(IKS_WORKER_ID_LABEL, ""))
                 or (annotations.get(CONFIG_NAME_ANNOTATION) if annotations.get(CONFIG_NAME_ANNOTATION) in configured
                     else None))
        if (owner and owner != name and worker_ids.get(labels.get(IKS_WORKER_ID_LABEL, "")) == owner
                and annotations.get(CONFIG_NAME_ANNOTATION) != owner):
            # The entry's worker runs under another name and is no replacement this program tied to the entry:
            # a wrong name, and fences and labels would miss the node.
            problems.append(f"node {owner} in gpu-migration:nodes has workerId {labels.get(IKS_WORKER_ID_LABEL)}, "
                            f"whose node is {name}; set its name to {name}")
        pool = labels.get(IKS_POOL_LABEL, "")
        if owner and worker_pools and pool not in worker_pools:
            problems.append(f"node {name} (gpu-migration:nodes entry {owner}) is in worker pool {pool or '?'}, "
                            f"outside gpu-migration:workerPools {worker_pools}: list it in the stack of its pool")
        if owner:
            now.setdefault(owner, _place(labels))
        elif (is_gpu_node(n) and not (temp_pool and pool == temp_pool)
              and not (worker_pools and pool not in worker_pools)):
            unlisted.append(n)
    # Entries whose node is gone after an earlier run saw it: their worker is being replaced.
    # Paired in the order WorkerReplacement pairs new workers with entries (iks/claims.py pair_new_workers): entries
    # by name, new workers by ID, so what this check takes is what the resumed replacements record.
    in_replacement = {name: seen[name] for name, stage in sorted(configured.items())
                      if name not in now and stage != "ibm-managed" and name in seen}
    resuming = sorted(in_replacement)
    _pair_unlisted(unlisted, in_replacement, operator_min_version, now, problems, warnings)
    for name, stage in configured.items():
        if name in now:
            continue
        if stage == "ibm-managed":
            problems.append(f"node {name} in gpu-migration:nodes (stage ibm-managed) matches no node in the "
                            "cluster; fix its name (`kubectl get nodes`)")
        elif name in in_replacement:
            warnings.append(f"node {name} in gpu-migration:nodes (stage {stage}) is gone since an earlier run saw it "
                            "and no new worker has joined yet: its replacement resumes")
        else:
            problems.append(f"node {name} in gpu-migration:nodes (stage {stage}) matches no node in the cluster and "
                            "no earlier run saw it; fix its name (`kubectl get nodes`)")
    return Inventory(problems, warnings, {**seen, **now}, resuming)


def _pair_unlisted(unlisted: list[client.V1Node], in_replacement: dict[str, dict[str, str]], operator_min_version: str,
                   now: dict[str, dict[str, str]], problems: list[str], warnings: list[str]) -> None:
    """Each GPU node no entry lists: a problem, unless it is the new worker of an entry whose replacement is under way
    (same pool and zone; then `now` ties it to that entry and it leaves `in_replacement`)."""
    unlisted.sort(key=lambda n: (n.metadata.labels or {}).get(IKS_WORKER_ID_LABEL) or n.metadata.name)
    for n in unlisted:
        labels, name = n.metadata.labels or {}, n.metadata.name
        kubelet = n.status.node_info.kubelet_version if n.status and n.status.node_info else None
        place = _place(labels)
        what = (f"GPU node {name} (kubelet {kubelet}, flavor {labels.get(IKS_FLAVOR_LABEL, '?')}, worker pool "
                f"{place['pool'] or '?'}, zone {place['zone'] or '?'}) is not listed in gpu-migration:nodes")
        add = f"{{name: {name}, workerId: {labels.get(IKS_WORKER_ID_LABEL, '?')}, stage: ...}}"
        if not version_at_least(kubelet, operator_min_version):
            problems.append(f"{what}: it runs IBM-managed drivers and would get the GPU Operator next to them; add "
                            f"it with stage ibm-managed ({add})")
            continue
        replaced = next((entry for entry, p in in_replacement.items() if p == place), None)
        if replaced is None:
            problems.append(f"{what}, and it is not the new worker of a listed node whose replacement is under way "
                            f"(none in that pool and zone); add it with its stage ({add}), or remove it from the "
                            "cluster")
            continue
        del in_replacement[replaced]
        now[replaced] = place
        warnings.append(f"{what}; taken for the new worker of {replaced} (same pool and zone, whose node is gone): "
                        f"the resumed replacement of {replaced} records it")


def workers_of_other_entries(api: ApiClient, own: Optional[str]) -> dict[str, str]:
    """Worker ID -> config entry, for every node that the readiness step tied to an entry other than `own`
    (CONFIG_NAME_ANNOTATION, on the node IKS labels with its worker ID). Durable across provider processes, so a
    replacement resumed by a later `pulumi up` never follows a worker another entry already recorded."""
    out: dict[str, str] = {}
    for n in client.CoreV1Api(api).list_node(label_selector=IKS_WORKER_ID_LABEL).items:
        labels, annotations = n.metadata.labels or {}, n.metadata.annotations or {}
        entry = annotations.get(CONFIG_NAME_ANNOTATION)
        if entry and entry != own and labels.get(IKS_WORKER_ID_LABEL):
            out[labels[IKS_WORKER_ID_LABEL]] = entry
    return out


def out_already(api: ApiClient, configured: dict[str, str]) -> tuple[list[str], list[str]]:
    """Config entries (past ibm-managed) whose node is out before this run's first step, each list in config order:
    - cordoned by this program (CORDON_ANNOTATION: a drain before a replace, a dra node held for its smoke test) and
      still cordoned: in flight when an earlier `up` stopped;
    - NotReady (its kubelet's Ready condition not True, whoever or whatever caused it): broken before the run.
    Both take the first slots of this run (components/slots.py): they are out already, so moving them costs no budget
    and frees it (Karpenter counts NotReady nodes against its budget; NVIDIA's upgrader stalls on one,
    gpu-operator#688), and a stop before their turn can't leave a drained node cordoned. Replacing the worker is IKS's
    own repair of a NotReady worker (`ibmcloud ks worker replace`); its drain follows kubectl's rules for a NotReady
    node (kube/eviction.py: no wait for pods its kubelet can't stop). A replaced node is its entry's by
    CONFIG_NAME_ANNOTATION. Nodes someone else cordoned stay in list order: they count against the budget, and the
    gates name them."""
    held, broken = set(), set()
    for n in client.CoreV1Api(api).list_node().items:
        annotations = n.metadata.annotations or {}
        entry = annotations.get(CONFIG_NAME_ANNOTATION) or n.metadata.name
        if configured.get(entry, "ibm-managed") == "ibm-managed":
            continue
        if n.spec and n.spec.unschedulable and annotations.get(CORDON_ANNOTATION):
            held.add(entry)
        conditions = (n.status.conditions if n.status else None) or []
        if not any(c.type == "Ready" and c.status == "True" for c in conditions):
            broken.add(entry)
    return [name for name in configured if name in held], [name for name in configured if name in broken]


class _GpuNodeInventoryProvider(_EveryUp):
    def run(self, api, p):
        # The first check of every `up`, before anything changes: the kubeconfig's identity holds the shipped role.
        permissions.require(api, p.get("shared_budget_namespace"), p.get("permissions"))
        found = inventory(api, p["configured"], p["worker_ids"], p["operator_min_version"], p.get("temp_pool"),
                          seen=(p.get("_previous") or {}).get("seen"), worker_pools=p.get("worker_pools"))
        for w in found.warnings:
            pulumi.log.warn(w)
        if found.problems:
            raise CheckFailed(f"GPU nodes in the cluster don't match gpu-migration:nodes; nothing was installed:"
                              f"{_bullets(found.problems)}")
        # Out before this run: drained and still cordoned, or being replaced (node gone), by an earlier `up`; NotReady.
        cordoned, broken = out_already(api, p["configured"])
        if broken:
            pulumi.log.warn(f"GPU node(s) of gpu-migration:nodes NotReady before this run: {', '.join(broken)}; they "
                            f"count against the budget and take the first slots (moving them costs no budget); "
                            f"their drain does not wait for pods a NotReady kubelet can't stop")
        held = {*cordoned, *found.resuming, *broken}
        return {"checked": sorted(p["configured"]), "seen": found.seen,
                "resume_first": [name for name in p["configured"] if name in held]}


class GpuNodeInventory(Resource, module="gpu-migration", name="GpuNodeInventory"):
    """Every GPU node of the cluster is listed in the config and every listed ibm-managed node exists; runs before
    the GPU Operator, so it never lands next to IBM's drivers on a node the config forgot."""

    checked: pulumi.Output[list[str]]
    resume_first: pulumi.Output[list[str]]  # entries an earlier run left cordoned (cordoned_by_earlier_run)

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], configured: dict[str, str],
                 worker_ids: dict[str, str], operator_min_version: str, temp_pool: Optional[str] = None,
                 worker_pools: Optional[list[str]] = None, shared_budget_namespace: Optional[str] = None,
                 permissions_scope: Optional[dict] = None, opts: Optional[pulumi.ResourceOptions] = None):
        props = dict(kubeconfig=kubeconfig, configured=configured, worker_ids=worker_ids,
                     operator_min_version=operator_min_version, temp_pool=temp_pool, checked=None, seen=None,
                     resume_first=None)
        if worker_pools:  # only then: a single stack's inventory keeps its inputs
            props["worker_pools"] = list(worker_pools)
        if shared_budget_namespace:  # its Lease's Role is checked up front too
            props["shared_budget_namespace"] = shared_budget_namespace
        if permissions_scope:  # what else the preflight checks: the smoke namespace's Role, the chart identity
            props["permissions"] = permissions_scope
        super().__init__(_GpuNodeInventoryProvider(), name, props, opts)
