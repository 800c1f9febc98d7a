"""The order of a fleet migration, decided before anything is declared: nodes -> turns -> gates.

Pure (no Pulumi, no cluster): tests check it directly, components/ declare resources from it, and `preview` and
`status` show `Plan.render()`.

Budget, as in Kubernetes rolling updates, GKE surge upgrades, EKS managed node groups' updateConfig and the GPU
Operator's driver upgrade policy (maxParallelUpgrades / maxUnavailable):
  - at most `maxUnavailable` of the N configured GPU nodes are unavailable at once: a count, or a percent of N rounded
    down (kubernetes/kubernetes pkg/controller/deployment/util/deployment_util.go ResolveFenceposts rounds
    maxUnavailable down and, if that and the surge are both 0, uses 1);
  - a temporary GPU pool of s workers is surge capacity: maxUnavailable + s nodes may be out at once while the cluster
    still keeps N - maxUnavailable GPU nodes available (GKE: nodes upgraded at once = maxSurge + maxUnavailable).
A slot per node, not a barrier per batch: maxUnavailable + s slots, and each node (its turn, in config order) starts
as soon as a slot is free; a node frees its slot when it is done (NVIDIA k8s-operator-libs pkg/upgrade recomputes
`maxParallelUpgrades - inProgress` at every pass; Cluster API's MachineDeployment and EKS/GKE surge upgrades replace
a node as soon as another finished). A node that takes a freed slot waits `soak` seconds first, then its gate counts
available GPU nodes in the cluster (nodes cordoned, NotReady or gone count against the budget) and opens only if the
node can go, with the nodes in flight, without dropping below N - maxUnavailable (`gate_decision`). Which node waits
for which slot is decided when `up` runs (components/slots.py, plan/slots.py).
"""
import math
import re
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence, Union

MaxUnavailable = Union[int, str]  # 2 or "25%"


class PlanError(ValueError):
    """The budget cannot be met; the message names the config key and value."""


class _Node(Protocol):
    name: str
    stage: str


def parse_max_unavailable(value: object) -> MaxUnavailable:
    """A node count (2, "2") or a percent of the GPU nodes ("25%"), as the stack config gives it."""
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"\d+(\.\d+)?%", text) and 0 < float(text[:-1]) <= 100:
        return text
    raise PlanError(f"maxUnavailable {value!r} must be a node count (e.g. 2) or a percent of nodes (e.g. 25%)")


def resolve_max_unavailable(spec: MaxUnavailable, fleet: int, surge: int = 0) -> int:
    """maxUnavailable as a node count: a percent of `fleet` rounds down; 0 with no surge would never progress."""
    if isinstance(spec, str) and spec.endswith("%"):
        count = math.floor(fleet * float(spec[:-1]) / 100)
    else:
        count = int(spec)
    if count == 0 and surge == 0:
        if spec in (0, "0"):
            raise PlanError("maxUnavailable is 0 but there is no surge capacity: enable tempGpuPool (its workers "
                            "are the surge) or set maxUnavailable >= 1")
        count = 1  # a percent that rounds to 0 still lets one node go (ResolveFenceposts)
    return min(count, fleet)


@dataclass(frozen=True)
class Budget:
    fleet: int  # configured GPU nodes
    max_unavailable: int
    surge: int = 0  # temporary GPU pool workers

    @property
    def batch_size(self) -> int:
        """Slots: nodes out at once."""
        return self.max_unavailable + self.surge

    @property
    def min_available(self) -> int:
        """GPU nodes that must stay available (temporary pool workers count) whenever a batch starts."""
        return self.fleet - self.max_unavailable


@dataclass(frozen=True)
class Batch:
    """One node's turn (a batch of one: the gates, drains and claims take a list, the node and the nodes in flight
    beside it). Turns start in config order, each as soon as a slot is free."""
    index: int  # 1-based, config order of the nodes that move
    nodes: tuple[str, ...]  # (the configured node name,)
    after: tuple[str, ...]  # the node whose turn comes before it (its gate opens first); () for the first
    soak_seconds: float  # waited after a slot frees, before the gate counts (0 for the first `slots` turns)
    ident: str = ""  # the node's config key (its resources' names)
    round: int = 1  # the turns started as one set of slots: ceil(index / slots) (workerPoolRules.canary everyBatch)

    @property
    def gate_name(self) -> str:
        return f"{self.ident or self.nodes[0]}-gate"

    @property
    def node(self) -> str:
        return self.nodes[0]


@dataclass(frozen=True)
class Plan:
    budget: Budget
    batches: tuple[Batch, ...]
    untouched: tuple[str, ...]  # ibm-managed nodes: labelled only, never replaced
    surge_pool: str = ""  # name of the temporary GPU pool, if any

    def batch_of(self, node: str) -> Optional[Batch]:
        return next((b for b in self.batches if node in b.nodes), None)

    @property
    def slots(self) -> int:
        return max(self.budget.batch_size, 1)

    def render(self) -> str:
        """What `preview` logs and `status` prints: the order, the budget and why."""
        b, slots = self.budget, self.slots
        surge = f" + surge {b.surge} from temporary GPU pool {self.surge_pool}" if b.surge else ""
        soak = next((t.soak_seconds for t in self.batches if t.soak_seconds), 0)
        lines = [
            f"migration plan: {len(self.batches)} of {b.fleet} GPU nodes, at most {slots} at once (maxUnavailable "
            f"{b.max_unavailable}{surge}): in config order, each node starts as soon as one of the {slots} slots is "
            f"free (a node frees its slot when it is done{f', then {soak:g}s of soak' if soak else ''}), once its "
            f"gate counts >= {b.min_available} available GPU nodes outside it and the nodes in flight (cordoned, "
            f"NotReady or missing nodes count against the budget); a failure stops the nodes not yet started"
        ]
        first, rest = self.batches[:slots], self.batches[slots:]
        if first:
            lines.append(f"  start at once: {', '.join(t.node for t in first)}")
        if rest:
            lines.append(f"  then each as a slot frees: {', '.join(t.node for t in rest)}")
        if self.untouched:
            lines.append(f"  not replaced (ibm-managed): {', '.join(self.untouched)}")
        return "\n".join(lines)


def make_plan(nodes: Sequence[_Node], max_unavailable: MaxUnavailable = 1, surge: int = 0,
              soak_seconds: float = 0, surge_pool: str = "") -> Plan:
    """Nodes past `ibm-managed` (replacements, dra switches and rollbacks), one turn each in config order, with
    `batch_size` slots."""
    budget = Budget(len(nodes), resolve_max_unavailable(max_unavailable, len(nodes), surge), surge)
    moving = [n for n in nodes if n.stage != "ibm-managed"]
    slots = max(budget.batch_size, 1)  # an empty fleet has nothing to move
    batches = tuple(
        Batch(i + 1, (n.name,), (moving[i - 1].name,) if i else (), soak_seconds if i >= slots else 0,
              getattr(n, "ident", "") or n.name, i // slots + 1)
        for i, n in enumerate(moving)
    )
    return Plan(budget, batches, tuple(n.name for n in nodes if n.stage == "ibm-managed"), surge_pool if surge else "")


def plan_for(cfg) -> Plan:
    """The plan of a validated MigrationConfig."""
    return make_plan(cfg.nodes, cfg.max_unavailable, cfg.surge, cfg.batch_soak_seconds, cfg.temp_gpu_pool.name)


# Gate ---------------------------------------------------------------------------------------------------------------


