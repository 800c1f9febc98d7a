"""The order of a fleet migration, decided before anything is declared: nodes -> batches -> gates.

Pure (no Pulumi, no cluster): tests check it directly, components/ declare resources from it, and `preview` and
`status` show `Plan.render()`.

Budget, as in Kubernetes rolling updates, GKE surge upgrades, EKS managed node groups' updateConfig and the GPU
Operator's driver upgrade policy (maxParallelUpgrades / maxUnavailable):
  - at most `maxUnavailable` of the N configured GPU nodes are unavailable at once: a count, or a percent of N rounded
    down (kubernetes/kubernetes pkg/controller/deployment/util/deployment_util.go ResolveFenceposts rounds
    maxUnavailable down and, if that and the surge are both 0, uses 1);
  - a temporary GPU pool of s workers is surge capacity: batches hold maxUnavailable + s nodes while the cluster
    still keeps N - maxUnavailable GPU nodes available (GKE: nodes upgraded at once = maxSurge + maxUnavailable).
Each batch after the first starts only once every node of the previous batch is done, then waits `soak` seconds, then
its gate counts available GPU nodes in the cluster (nodes cordoned, NotReady or gone count against the budget) and
opens only if the batch can go without dropping below N - maxUnavailable (`gate_decision`).
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
        return self.max_unavailable + self.surge

    @property
    def min_available(self) -> int:
        """GPU nodes that must stay available (temporary pool workers count) whenever a batch starts."""
        return self.fleet - self.max_unavailable


@dataclass(frozen=True)
class Batch:
    index: int  # 1-based
    nodes: tuple[str, ...]  # configured node names, in config order
    after: tuple[str, ...]  # the previous batch: this one starts only once those nodes are done
    soak_seconds: float  # waited after the previous batch, before the gate counts

    @property
    def gate_name(self) -> str:
        return f"batch-{self.index}-gate"


@dataclass(frozen=True)
class Plan:
    budget: Budget
    batches: tuple[Batch, ...]
    untouched: tuple[str, ...]  # ibm-managed nodes: labelled only, never replaced
    surge_pool: str = ""  # name of the temporary GPU pool, if any

    def batch_of(self, node: str) -> Optional[Batch]:
        return next((b for b in self.batches if node in b.nodes), None)

    def render(self) -> str:
        """What `preview` logs and `status` prints: the batches, the budget and why."""
        b = self.budget
        surge = f" + surge {b.surge} from temporary GPU pool {self.surge_pool}" if b.surge else ""
        soak = self.batches[1].soak_seconds if len(self.batches) > 1 else 0
        lines = [
            f"migration plan: {sum(len(x.nodes) for x in self.batches)} of {b.fleet} GPU nodes in "
            f"{len(self.batches)} batch(es) of at most {b.batch_size} (maxUnavailable {b.max_unavailable}{surge}); "
            f"each batch starts after the previous one is done{f' and {soak:g}s of soak' if soak else ''}, "
            f"once its gate counts >= {b.min_available} available GPU nodes outside the batch "
            f"(cordoned, NotReady or missing nodes count against the budget); a failure stops later batches"
        ]
        lines += [f"  batch {x.index}: {', '.join(x.nodes)}" for x in self.batches]
        if self.untouched:
            lines.append(f"  not replaced (ibm-managed): {', '.join(self.untouched)}")
        return "\n".join(lines)


def make_plan(nodes: Sequence[_Node], max_unavailable: MaxUnavailable = 1, surge: int = 0,
              soak_seconds: float = 0, surge_pool: str = "") -> Plan:
    """Nodes past `ibm-managed` (replacements, dra switches and rollbacks) in config order, `batch_size` at a time."""
    budget = Budget(len(nodes), resolve_max_unavailable(max_unavailable, len(nodes), surge), surge)
    moving = [n.name for n in nodes if n.stage != "ibm-managed"]
    size = max(budget.batch_size, 1)  # an empty fleet has nothing to batch
    groups = [tuple(moving[i:i + size]) for i in range(0, len(moving), size)]
    batches = tuple(
        Batch(i + 1, group, groups[i - 1] if i else (), soak_seconds if i else 0) for i, group in enumerate(groups)
    )
    return Plan(budget, batches, tuple(n.name for n in nodes if n.stage == "ibm-managed"), surge_pool if surge else "")


def plan_for(cfg) -> Plan:
    """The plan of a validated MigrationConfig."""
    return make_plan(cfg.nodes, cfg.max_unavailable, cfg.surge, cfg.batch_soak_seconds, cfg.temp_gpu_pool.name)


# Gate ---------------------------------------------------------------------------------------------------------------


