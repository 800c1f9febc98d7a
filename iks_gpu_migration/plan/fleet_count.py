"""How many of a fleet's GPU nodes are out right now, for a budget shared by several stacks (plan/shared_budget.py).

Counted from what the cluster shows, not from what stacks claim. Each stack records in the budget's Lease its worker
pools and how many GPU nodes it configured (a Member); its nodes out are those it configured minus the GPU nodes of
its pools that are Ready and schedulable. That counts a node cordoned or NotReady, a node whose worker was deleted
and whose replacement has not joined, and a replaced node still joining, whoever caused it (the stack, a stack that
died, maintenance, nobody), without knowing the replacement's name (IKS gives it a new one). On top: the nodes other
stacks claimed and have not taken out yet (still Ready and schedulable: they will go), and the unavailable GPU nodes
of pools no stack recorded. The batch asking counts as out whether its nodes went out yet or not.

Pure: Node views, the members and the claimed names in, a count and what it is made of out.
"""
from dataclasses import dataclass
from typing import Iterable, Sequence

from .gates import IKS_POOL_LABEL, NodeView, selector_matches

SHOWN = 5


@dataclass(frozen=True)
class Member:
    """A stack of the fleet: its worker pools (() = every pool no other member names) and its configured GPU
    nodes."""
    pools: tuple[str, ...]
    nodes: int

    def holds(self, view: NodeView, named: frozenset[str]) -> bool:
        """Is `view` in this member's pools? `named`: the pools any member names (a member of every pool takes the
        rest, so no node counts for two stacks)."""
        pool = view.labels.get(IKS_POOL_LABEL, "")
        return pool in self.pools if self.pools else pool not in named


Members = dict[str, Member]  # holder -> member


@dataclass(frozen=True)
class Fleet:
    """The cluster as the count sees it: every Node (views), which are GPU nodes (selector), the stacks (members)."""
    views: tuple[NodeView, ...]
    selector: str
    members: Members


@dataclass(frozen=True)
class FleetOut:
    count: int
    parts: tuple[str, ...]  # what the count is made of, for a person

    @property
    def text(self) -> str:
        return "; ".join(self.parts)


def _named(names: Sequence[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def fleet_out(fleet: Fleet, batch: Sequence[str], pending: Iterable[str] = (), asking: str = "") -> FleetOut:
    """GPU nodes out across the fleet with `batch` out: each member's configured nodes minus its available GPU nodes
    outside the batch; the `pending` nodes (other stacks' live claims) still available, not yet out; the unavailable
    GPU nodes of pools no member holds. A stack `asking` that is no member counts its batch as itself."""
    gpu = [v for v in fleet.views if selector_matches(fleet.selector, v.labels)]
    named = frozenset(p for m in fleet.members.values() for p in m.pools)
    count, parts = 0 if asking in fleet.members else len(batch), []
    for holder, member in sorted(fleet.members.items()):
        up = sum(1 for v in gpu if member.holds(v, named) and v.available and not v.member_of(batch))
        out = max(0, member.nodes - up)
        if holder == asking:  # its batch is out by admission, whatever its pools hold besides
            out = max(out, len(batch))
        count += out
        if out:
            parts.append(f"{holder}: {out} of its {member.nodes} node(s)")
    claimed = set(pending) - set(batch)
    waiting = sorted(v.name for v in gpu if v.available and (v.name in claimed or v.config_name in claimed)
                     and not v.member_of(batch))
    loose = sorted(v.name for v in gpu if not any(m.holds(v, named) for m in fleet.members.values())
                   and not v.available and not v.member_of(batch))
    if waiting:
        parts.append(f"claimed by other stacks, not out yet: {_named(waiting)}")
    if loose:
        parts.append(f"unavailable in pools of no stack: {_named(loose)}")
    return FleetOut(count + len(waiting) + len(loose), tuple(parts))

