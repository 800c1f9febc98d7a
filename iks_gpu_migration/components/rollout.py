"""Rollout: the plan's turns declared, a CapacityGate per node, each node's steps after its gate; at most `slots`
nodes in flight, the next one starting as soon as one of them is done (plan/slots.py decides, components/slots.py
follows the engine).

Why the order is not a `depends_on` chain: the SDK's cycle check walks every transitive dependency of each new edge
(sdk_workarounds.py, 2.); a chain through all nodes makes that walk O(n) per edge, O(n^2) per program, and recursion
O(n) deep: 1000 nodes raised RecursionError. Instead each gate takes an input (`slot`) whose future resolves only once
the node may start, and which carries no resources. The SDK registers a resource only after its inputs resolve, and
the engine answers RegisterResource only once the step finished, so a node's gate reaches the engine only once a slot
is free, while the dependency graph stays a constant depth per node. A failed node makes the turns not yet given fail:
those gates are never registered, and nodes in flight finish (the engine lets in-flight steps end). In preview nothing
runs: every turn resolves at once and preview shows every node.
"""
import hashlib
import json
from typing import TYPE_CHECKING, Any, Callable, Optional

import pulumi

from ..kube import capacity_gate, shared_budget
from ..plan import Batch, Plan
from . import slots

if TYPE_CHECKING:
    from .gpu_node import GpuNode


# Steps that may run beside the nodes in flight (each node runs one step at a time, its gate and DRA preflight
# included): chart upgrades, the shared budget's release.
PARALLEL_HEADROOM = 8


def parallel_needed(batch_size: int) -> int:
    """The `--parallel` under which every node in flight (`batch_size`: the slots) progresses at once (the engine runs
    at most `--parallel` steps together: pkg/resource/deploy/step_executor.go; its default is 4 x CPUs,
    pkg/cmd/pulumi/operations/up.go `defaultParallel`). The dynamic-provider host is no bound
    (sdk_workarounds.widen_provider_host)."""
    return batch_size + PARALLEL_HEADROOM


def engine_parallel() -> Optional[int]:
    """The engine's `--parallel`, as the language host passes it to the program (pulumi-language-python-exec
    `--parallel` -> runtime settings); None when unknown (e.g. under mocks)."""
    value = getattr(pulumi.runtime.settings.SETTINGS, "parallel", None)
    return value if isinstance(value, int) and value > 0 else None


def show(plan: Plan) -> None:
    """The plan in `pulumi preview`, and a warning when the engine's `--parallel` would hold a batch back."""
    if pulumi.runtime.is_dry_run():
        pulumi.log.info(plan.render())
    parallel, needed = engine_parallel(), parallel_needed(plan.budget.batch_size)
    if parallel is not None and parallel < needed and plan.batches:  # one warning: show() runs once per program run
        pulumi.log.warn(
            f"run `pulumi up --parallel {needed}`: {min(plan.slots, len(plan.batches))} nodes may be in flight at "
            f"once, but `--parallel` {parallel} lets the engine run only {parallel} steps together "
            f"(docs/fleet-scale.md)")



def holder() -> str:
    """This stack's name, as claims held it before they carried the stack's own ID (SharedBudgetHolder)."""
    # DIY backends call every stack's organization "organization"; the engine may pass none (e.g. under mocks).
    return f"{pulumi.get_organization() or 'organization'}/{pulumi.get_project()}/{pulumi.get_stack()}"


def shared_settings(cfg: Any) -> Optional[dict[str, Any]]:
    """What the gates, the drains and the release need of gpu-migration:sharedBudget (None without one): the holder
    is this stack's unique name (SharedBudgetHolder, declared here once per program)."""
    b = cfg.shared_budget
    if b is None:
        return None
    unique = shared_budget.SharedBudgetHolder("shared-budget-holder", holder())
    # pools and nodes: this stack as the fleet's count sees it (plan/fleet_count.py Member).
    return {"name": b.name, "namespace": b.namespace, "max_unavailable": b.max_unavailable, "holder": unique.holder,
            "legacy_holder": holder(), "claim_ttl": b.claim_ttl, "pools": list(cfg.worker_pools),
            "nodes": len(cfg.nodes)}


def plan_fingerprint(plan: Plan, cfg: Any) -> str:
    """Changes whenever a gate may run again (the inputs that re-run a CapacityGate): then the release runs again
    after the last batch."""
    stages = {n.name: n.stage for n in cfg.nodes}
    text = json.dumps([[b.index, list(b.nodes), [stages[n] for n in b.nodes]] for b in plan.batches]
                      + [plan.budget.min_available, cfg.gpu_node_selector, cfg.kube_version])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Rollout(pulumi.ComponentResource):
    """The plan's turns: one CapacityGate per node (children of this component); each node migrates
    (`migrate(node, after, slot)`) after its gate and `after` (inventory, master, temporary pool), `slot` being the
    node's turn (the nodes in flight beside it). `first_after` (a `once_done([], ...)` value) holds the first gates
    back without a dependency edge, e.g. until the GPU Operator runs on the temporary pool. `finish(index, members)`
    declares what verifies a node once its steps are declared (before its slot frees). `resume_first`: the nodes an
    earlier run left out or broken before the run (the inventory's), which take the first slots."""

    def __init__(self, plan: Plan, gpu_nodes: dict[str, "GpuNode"], cfg: Any, after: list[pulumi.Resource],
                 migrate: Callable[["GpuNode", list[pulumi.Resource], pulumi.Output], None],
                 first_after: Optional[pulumi.Output] = None,
                 finish: Optional[Callable[[int, list["GpuNode"]], None]] = None,
                 shared: Optional[dict[str, Any]] = None, resume_first: Optional[pulumi.Output] = None):
        super().__init__("gpu-migration:index:Rollout", "rollout")
        self.shared = shared  # shared_settings(cfg)
        self.gates: list[capacity_gate.CapacityGate] = []
        preview = pulumi.runtime.is_dry_run()
        self.turns = slots.SlotTurns(plan, preview, first_after, resume_first)
        members: list["GpuNode"] = []
        for turn in plan.batches:
            gpu_node, slot = gpu_nodes[turn.node], self.turns.turn(turn.node)
            gate = self._gate(turn, plan, gpu_node, cfg, slot, after)
            migrate(gpu_node, [*after, gate], slot)
            if finish is not None:
                finish(turn.index, [gpu_node])
            members.append(gpu_node)
        self.turns.watch(members)
        self.budget_release = self._release(plan, cfg, preview)
        self.register_outputs({})

    def _release(self, plan: Plan, cfg: Any, preview: bool) -> Optional[shared_budget.SharedBudgetRelease]:
        """With a shared budget: after the last node, the stack's claim goes (each gate already replaced it with the
        nodes in flight)."""
        shared = self.shared
        if shared is None or not plan.batches:
            return None
        return shared_budget.SharedBudgetRelease(
            "shared-budget-release", kubeconfig=cfg.kubeconfig, shared=shared, plan=plan_fingerprint(plan, cfg),
            after=self.turns.all_done(), opts=pulumi.ResourceOptions(parent=self))

    def _gate(self, turn: Batch, plan: Plan, gpu_node: "GpuNode", cfg: Any, slot: pulumi.Output,
              after: list[pulumi.Resource]) -> capacity_gate.CapacityGate:
        gate = capacity_gate.CapacityGate(
            turn.gate_name,
            kubeconfig=cfg.kubeconfig,
            index=turn.index,
            batch=turn.nodes,
            stages={turn.node: gpu_node.node.stage},
            kube_version=cfg.kube_version,
            after=list(turn.after),
            slot=slot,
            selector=cfg.gpu_node_selector,
            min_available=plan.budget.min_available,
            soak_seconds=turn.soak_seconds,
            timeout=cfg.timeouts.capacity_gate,
            poll_interval=cfg.timeouts.poll_interval,
            shared=self.shared,
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )
        self.gates.append(gate)
        return gate
