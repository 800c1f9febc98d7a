"""Gate decisions: may a batch start now, may a node of an admitted batch be drained now? Pure: a list of node
views in, a decision naming what it counted out."""
import functools
from dataclasses import dataclass
from typing import Iterable, Sequence

# Which Nodes are GPU nodes, before and after the GPU Operator:
# - IKS labels its GPU workers itself: IBM Cloud docs "Monitoring NVIDIA GPUs" (ibm-cloud-docs/monitoring
#   infrastructure/nvidia.md, #nvidia-gpu-monitoring-iks-step2) install the GPU Operator on IKS with the nodeSelector
#   `ibm-cloud.kubernetes.io/gpu-enabled: "true"` "to only be installed on worker nodes provisioned with NVIDIA GPUs",
#   so the label is on a worker before the operator runs (also on workers that keep IBM's drivers).
# - `nvidia.com/gpu.present=true` is the GPU Operator's (gpu-operator controllers/state_manager.go, from NFD's
#   pci-10de label): absent until the operator and NFD run on the node.
# - IKS labels every worker with its flavor (IBM-Cloud/cloud-provider-ibm ibm/ibm_metadata_service.go,
#   machineTypeLabel); IKS GPU flavors are the gx families (gx3.16x80.l4, gx2.16x128.2v100).
IKS_GPU_LABEL = "ibm-cloud.kubernetes.io/gpu-enabled"
OPERATOR_GPU_LABEL = "nvidia.com/gpu.present"
IKS_FLAVOR_LABEL = "ibm-cloud.kubernetes.io/machine-type"
# IKS labels every worker with its worker pool (IBM Cloud docs "Adding labels and taints to worker nodes"; read by the
# inventory and by a shared budget's count of each stack's pools, plan/fleet_count.py).
IKS_POOL_LABEL = "ibm-cloud.kubernetes.io/worker-pool-name"
GPU_FLAVOR_PREFIXES = ("gx",)
# Either label: IKS's holds before the operator, the operator's on any node it labelled.
DEFAULT_GPU_NODE_SELECTOR = f"{IKS_GPU_LABEL}=true|{OPERATOR_GPU_LABEL}=true"
# The default of releases before the IKS label was known: a stack deployed with it counts with today's default
# without its gates running again (kube/capacity_gate.py diff).
LEGACY_DEFAULT_GPU_NODE_SELECTOR = f"{OPERATOR_GPU_LABEL}=true"
MISSED_SHOWN = 10  # GPU nodes the selector misses named in a decision; the rest are counted


def gpu_hints(labels: dict, gpu_resource: bool = False) -> tuple[str, ...]:
    """Why a node looks like a GPU node, whatever gpuNodeSelector says ((): it does not)."""
    hints = [f"{key}={labels[key]}" for key in (IKS_GPU_LABEL, OPERATOR_GPU_LABEL) if labels.get(key) == "true"]
    if str(labels.get(IKS_FLAVOR_LABEL, "")).startswith(GPU_FLAVOR_PREFIXES):
        hints.append(f"{IKS_FLAVOR_LABEL}={labels[IKS_FLAVOR_LABEL]}")
    if gpu_resource:
        hints.append("nvidia.com/gpu capacity")
    return tuple(hints)


@dataclass(frozen=True)
class NodeView:
    """What the gate reads of a Node: name, labels, spec.unschedulable, the Ready condition, the config entry
    a replaced node belongs to (the annotation its readiness check wrote; its name changed with the replacement),
    and whether it has nvidia.com/gpu capacity (a GPU node the selector might miss)."""
    name: str
    labels: dict
    unschedulable: bool = False
    ready: bool = True
    config_name: str = ""
    gpu_resource: bool = False

    def member_of(self, batch: Sequence[str]) -> bool:
        return self.name in batch or self.config_name in batch

    @property
    def available(self) -> bool:
        return self.ready and not self.unschedulable

    def why_not(self) -> str:
        return ", ".join(w for w, bad in (("NotReady", not self.ready), ("cordoned", self.unschedulable)) if bad)


@functools.lru_cache(maxsize=64)
def _alternatives(selector: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The selector parsed once (a gate reads it for every Node at every poll): its non-empty alternatives."""
    parsed = (tuple((k.strip(), v.strip()) for k, _, v in (t.partition("=") for t in a.split(",") if t.strip()))
              for a in selector.split("|"))
    return tuple(a for a in parsed if a)


def selector_matches(selector: str, labels: dict) -> bool:
    """`key=value[,key=value]` alternatives separated by `|`: a node matches one alternative when every one of its
    terms matches."""
    return any(all(labels.get(k) == v for k, v in terms) for terms in _alternatives(selector))


@dataclass(frozen=True)
class GateDecision:
    open: bool
    available: tuple[str, ...]  # GPU nodes outside the batch that are Ready and schedulable
    unavailable: tuple[str, ...]  # "name (why)" of counted GPU nodes outside the batch that are not
    needed: int
    selector: str = ""
    # "name (hints)" of nodes that look like GPU nodes (gpu_hints) but gpuNodeSelector does not match, in or out of
    # the batch, at most MISSED_SHOWN; `missed_count` counts them all. They are not counted: the budget is short.
    missed: tuple[str, ...] = ()
    missed_count: int = 0

    @property
    def state(self) -> str:
        text = f"{len(self.available)} GPU nodes available outside the batch, {self.needed} needed"
        text += f"; unavailable: {', '.join(self.unavailable)}" if self.unavailable else ""
        if len(self.available) + len(self.unavailable) < self.needed:  # too few match: likely the selector
            text += (f"; only {len(self.available) + len(self.unavailable)} nodes outside the batch match "
                     f"gpuNodeSelector {self.selector!r}: it must match every GPU node (old, replaced, temporary pool)")
        return text + self.missed_text

    @property
    def missed_text(self) -> str:
        """The GPU nodes gpuNodeSelector misses and the fix ("" when it misses none)."""
        if not self.missed_count:
            return ""
        more = f" and {self.missed_count - len(self.missed)} more" if self.missed_count > len(self.missed) else ""
        return (f"; {self.missed_count} GPU node(s) not matched by gpuNodeSelector {self.selector!r}, so not "
                f"counted: {', '.join(self.missed)}{more}; set gpu-migration:gpuNodeSelector to labels every GPU "
                f"node carries (alternatives separated by |, e.g. {DEFAULT_GPU_NODE_SELECTOR})")


def _missed(observed: Sequence[NodeView], selector: str) -> list[str]:
    return sorted(f"{n.name} ({', '.join(hints)})" for n in observed
                  if (hints := gpu_hints(n.labels, n.gpu_resource)) and not selector_matches(selector, n.labels))


def gate_decision(observed: Iterable[NodeView], batch: Sequence[str], selector: str,
                  min_available: int) -> GateDecision:
    """Open only if, with the whole batch out, at least `min_available` GPU nodes stay available.

    GPU nodes are those matching `selector` (old, replaced and temporary-pool nodes alike: a label, not names, so the
    gate's inputs stay O(batch) and the plan O(n)); a GPU node missing from the cluster simply is not available.
    Every cordoned or NotReady node counts against the budget, also one this program cordoned (a dra node held for
    its smoke test serves no GPU workloads). `batch` holds configured names; a node replaced in an earlier run is a
    member by its config entry (NodeView.config_name), so it is not mistaken for spare capacity. Nodes that look like
    GPU nodes (gpu_hints: IKS's GPU label or flavor, the operator's label, nvidia.com/gpu capacity) but do not match
    `selector` are named in the decision: the inventory made every GPU node a config entry or a temporary pool
    worker, so these are GPU nodes the budget misses.
    """
    observed = list(observed)
    counted = [n for n in observed if not n.member_of(batch) and selector_matches(selector, n.labels)]
    available = tuple(sorted(n.name for n in counted if n.available))
    unavailable = tuple(sorted(f"{n.name} ({n.why_not()})" for n in counted if not n.available))
    missed = _missed(observed, selector)
    return GateDecision(len(available) >= min_available, available, unavailable, min_available, selector,
                        tuple(missed[:MISSED_SHOWN]), len(missed))


def drain_decision(observed: Iterable[NodeView], node: str, batch: Sequence[str], selector: str,
                   min_available: int) -> GateDecision:
    """May `node` (a member of the admitted `batch`, by its configured or current name) be drained now? The gate's
    decision again, at this moment: its batch-mates are out by admission (cordoned, draining, being replaced or
    replaced, whatever state each is in), so only GPU nodes outside the batch count, and `node` is out whatever its
    name (a node renamed by an earlier replacement whose config annotation is not written yet). It closes only when
    something beyond the admitted batch became unavailable since the gate, leaving fewer than `min_available`."""
    return gate_decision(observed, [*batch, *([node] if node not in batch else [])], selector, min_available)
