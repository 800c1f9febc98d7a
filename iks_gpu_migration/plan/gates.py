"""Gate decisions: may a batch start now? Pure: a list of node views in, a decision naming what it counted out."""
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class NodeView:
    """What the gate reads of a Node: name, labels, spec.unschedulable, the Ready condition, and the config entry
    a replaced node belongs to (the annotation its readiness check wrote; its name changed with the replacement)."""
    name: str
    labels: dict
    unschedulable: bool = False
    ready: bool = True
    config_name: str = ""

    def member_of(self, batch: Sequence[str]) -> bool:
        return self.name in batch or self.config_name in batch

    @property
    def available(self) -> bool:
        return self.ready and not self.unschedulable

    def why_not(self) -> str:
        return ", ".join(w for w, bad in (("NotReady", not self.ready), ("cordoned", self.unschedulable)) if bad)


def selector_matches(selector: str, labels: dict) -> bool:
    """`key=value[,key=value]`, every term must match."""
    terms = [t.partition("=") for t in selector.split(",") if t.strip()]
    return bool(terms) and all(labels.get(k.strip()) == v.strip() for k, _, v in terms)


@dataclass(frozen=True)
class GateDecision:
    open: bool
    available: tuple[str, ...]  # GPU nodes outside the batch that are Ready and schedulable
    unavailable: tuple[str, ...]  # "name (why)" of counted GPU nodes outside the batch that are not
    needed: int
    selector: str = ""

    @property
    def state(self) -> str:
        text = f"{len(self.available)} GPU nodes available outside the batch, {self.needed} needed"
        text += f"; unavailable: {', '.join(self.unavailable)}" if self.unavailable else ""
        if len(self.available) + len(self.unavailable) < self.needed:  # too few match: likely the selector
            text += (f"; only {len(self.available) + len(self.unavailable)} nodes outside the batch match "
                     f"gpuNodeSelector {self.selector!r}: it must match every GPU node (old, replaced, temporary pool)")
        return text


def gate_decision(observed: Iterable[NodeView], batch: Sequence[str], selector: str,
                  min_available: int) -> GateDecision:
    """Open only if, with the whole batch out, at least `min_available` GPU nodes stay available.

    GPU nodes are those matching `selector` (old, replaced and temporary-pool nodes alike: a label, not names, so the
    gate's inputs stay O(batch) and the plan O(n)); a GPU node missing from the cluster simply is not available.
    Every cordoned or NotReady node counts against the budget, also one this program cordoned (a dra node held for
    its smoke test serves no GPU workloads). `batch` holds configured names; a node replaced in an earlier run is a
    member by its config entry (NodeView.config_name), so it is not mistaken for spare capacity.
    """
    counted = [n for n in observed if not n.member_of(batch) and selector_matches(selector, n.labels)]
    available = tuple(sorted(n.name for n in counted if n.available))
    unavailable = tuple(sorted(f"{n.name} ({n.why_not()})" for n in counted if not n.available))
    return GateDecision(len(available) >= min_available, available, unavailable, min_available, selector)
