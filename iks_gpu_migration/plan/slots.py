"""Which node starts when: a slot per node, not a barrier per batch. Pure: events in, the nodes that may start out.

At most `slots` nodes are in flight at once; the next node in config order starts as soon as one of them is done,
not when its whole batch is (NVIDIA k8s-operator-libs pkg/upgrade recomputes `maxParallelUpgrades - inProgress` at
each pass; Cluster API's MachineDeployment and EKS/GKE surge upgrades start a node as another one finishes). A node
that failed stops every node not yet started (the nodes in flight finish: the engine lets in-flight steps end).
Nodes an earlier `up` left out (`resumed`: drained, or their worker being replaced) count as started: they come first
and still take their slots after a failure, so a stop never leaves them cordoned or half-replaced.

`components/slots.py` drives it from the engine's answers while `up` runs; tests/fleet_sim.py drives it from a
simulated clock. Nodes waiting for a slot are decided here, in the program, so they hold none of the engine's
`--parallel` steps (docs/fleet-scale.md).
"""
from dataclasses import dataclass, field
from typing import Collection, Optional, Sequence


@dataclass(frozen=True)
class Start:
    """A node that may start now: `peers`, the nodes in flight beside it (its gate and drains count them out by
    admission, as a batch's gate counted its batch-mates); `freed_by`, the node whose end freed its slot (None: one
    of the first `slots` nodes, nothing to soak after)."""
    node: str
    peers: tuple[str, ...]
    freed_by: Optional[str]


@dataclass
class Slots:
    order: Sequence[str]  # configured names, config order
    slots: int
    started: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # in the order they ended
    failed: dict[str, str] = field(default_factory=dict)  # node -> why
    stopped: Optional[str] = None  # why no further node starts
    resumed: frozenset = frozenset()  # nodes an earlier `up` left out: first in `order`, they start even when stopped

    def __post_init__(self) -> None:
        self.order = resume_order(self.order, self.resumed)

    @property
    def in_flight(self) -> tuple[str, ...]:
        ended = {*self.done, *self.failed}
        return tuple(n for n in self.started if n not in ended)

    @property
    def waiting(self) -> tuple[str, ...]:
        return tuple(self.order[len(self.started):])

    def may_start(self) -> bool:
        """A node waits and may take a free slot: any node, or once stopped only a resumed one."""
        waiting = self.waiting
        return bool(waiting) and (not self.stopped or waiting[0] in self.resumed)

    def starts(self, freed_by: Optional[str] = None) -> list[Start]:
        """The nodes that start now, in order, while a slot is free (once stopped, only resumed ones)."""
        out: list[Start] = []
        while self.may_start() and len(self.in_flight) < self.slots:
            node = self.waiting[0]
            out.append(Start(node, self.in_flight, freed_by if self.started and len(self.started) >= self.slots
                             else None))
            self.started.append(node)
        return out

    def finish(self, node: str) -> list[Start]:
        """`node` is done: its slot frees; the nodes that start now."""
        if node in self.in_flight:
            self.done.append(node)
        return self.starts(freed_by=node)

    def fail(self, node: str, why: str) -> list[Start]:
        """`node` failed: no node not yet started starts (the nodes in flight finish); its slot goes to a resumed
        node, if one waits (the gates count what the failed node left out)."""
        if node in self.in_flight:
            self.failed[node] = why
        self.stopped = self.stopped or f"node {node} did not finish ({why})"
        return self.starts(freed_by=node)

    def finished(self) -> bool:
        """Every node ended (done or failed), or the rest will never start."""
        return not self.in_flight and not self.may_start()

    @property
    def never_started(self) -> tuple[str, ...]:
        """The nodes a stop keeps from starting (all waiting ones, resumed ones excepted)."""
        return tuple(n for n in self.waiting if n not in self.resumed) if self.stopped else ()


def resume_order(order: Sequence[str], held: Collection[str]) -> list[str]:
    """The nodes an earlier run left out (`held`) first, in config order, then the rest in config order."""
    return [n for n in order if n in held] + [n for n in order if n not in held]
