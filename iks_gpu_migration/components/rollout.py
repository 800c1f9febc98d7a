"""Rollout: the plan's batches declared, a CapacityGate per batch, the batch's nodes after it, the next batch after them.

Why the order between batches is not a `depends_on` chain: the SDK's cycle check walks every transitive dependency of
each new edge (sdk_workarounds.py, 2.); a chain through all nodes makes that walk O(n) per edge, O(n^2) per program,
and recursion O(n) deep: 1000 nodes raised RecursionError.

Instead the next batch's gate takes an input (`after`) whose future resolves only once every node of the previous
batch is done, and which carries no resources. The SDK registers a resource only after its inputs resolve, and the
engine answers RegisterResource only once the step finished, so batch i+1 reaches the engine after batch i is done,
while the dependency graph stays a constant depth per node. A failed node makes that future fail: the next gate is
never registered, later batches never start, and nodes already running finish (the engine lets in-flight steps end).
In preview nothing runs, so the gates get the same value (the previous batch's configured names) at once instead of
waiting for the previous batch's registrations: preview stays O(n) even at one node per batch, and shows every batch.
"""
import hashlib
import json
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import pulumi

from ..kube import capacity_gate, shared_budget
from ..plan import Batch, Plan
from ..sdk_workarounds import edge_free
from ..state_compat import WAS_AT_ROOT

if TYPE_CHECKING:
    from .gpu_node import GpuNode


# Steps that may run beside a batch's nodes (each node runs one step at a time): the batch's gate and DRA preflight,
# chart upgrades, the next batch's gate once this one is done.
PARALLEL_HEADROOM = 8


def parallel_needed(batch_size: int) -> int:
    """The `--parallel` under which every node of a batch progresses at once (the engine runs at most `--parallel`
    steps together: pkg/resource/deploy/step_executor.go; its default is 4 x CPUs, pkg/cmd/pulumi/operations/up.go
    `defaultParallel`). The dynamic-provider host is no bound (sdk_workarounds.widen_provider_host)."""
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
    if parallel is not None and parallel < needed and plan.batches:
        pulumi.log.warn(
            f"batches of {plan.budget.batch_size} nodes, but the engine runs at most {parallel} steps at once "
            f"(`--parallel`, default 4 x CPUs): fewer nodes of a batch than it holds progress together. Run "
            f"`pulumi up --parallel {needed}` (batch size + {PARALLEL_HEADROOM}) or more (docs/fleet-scale.md)"
        )


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


class BatchStopped(RuntimeError):
    """A node of the previous batch failed, so this batch was not started."""


def when_done(batch: Batch, nodes: Sequence["GpuNode"], next_index: int, stopped: str = "") -> pulumi.Output:
    """`batch.nodes` (the configured names, the same value preview shows), resolved only once every node of the batch
    is done; carries no resources on purpose (see the module docstring). `stopped`: what a failure holds back
    (default: the later batches)."""
    stopped = stopped or f"batch {next_index} and later were not started"

    async def wait() -> list[str]:
        for gpu_node in nodes:
            try:  # the node's last checks before the next batch may go (GpuNode.done_by)
                for resource in gpu_node.done_by:
                    await resource.urn.future()
            except BatchStopped:
                raise  # an earlier batch failed: say so once, not nested per batch
            except Exception as e:  # noqa: BLE001 - any failure of the node stops later batches
                raise BatchStopped(
                    f"{stopped}: node {gpu_node.node.name} of batch "
                    f"{batch.index} did not finish ({e}); fix it and run `pulumi up` again "
                    f"(finished nodes are not redone)"
                ) from None
        return list(batch.nodes)

    return edge_free(wait())


class Rollout(pulumi.ComponentResource):
    """The plan's batches: one CapacityGate per batch (children of this component); each node of a batch migrates
    (`migrate(node, after)`) after its gate and `after` (inventory, master, temporary pool). `first_after` (a
    `once_done([], ...)` value) holds the first gate back without a dependency edge, e.g. until the GPU Operator runs
    on the temporary pool. `finish(index, members)` declares what verifies a batch once its nodes are declared
    (before the next batch's gate waits for them)."""

    def __init__(self, plan: Plan, gpu_nodes: dict[str, "GpuNode"], cfg: Any, after: list[pulumi.Resource],
                 migrate: Callable[["GpuNode", list[pulumi.Resource]], None],
                 first_after: Optional[pulumi.Output] = None,
                 finish: Optional[Callable[[int, list["GpuNode"]], None]] = None,
                 shared: Optional[dict[str, Any]] = None):
        super().__init__("gpu-migration:index:Rollout", "rollout")
        self.shared = shared  # shared_settings(cfg)
        self.gates: list[capacity_gate.CapacityGate] = []
        previous: Optional[tuple[Batch, list["GpuNode"]]] = None
        preview = pulumi.runtime.is_dry_run()
        for batch in plan.batches:
            if previous is None and first_after is not None:
                waits_for: Any = first_after
            elif preview or previous is None:
                waits_for = list(batch.after)
            else:  # made only when a later batch awaits it (an unawaited failure would be reported twice)
                waits_for = when_done(*previous, batch.index)
            gate = self._gate(batch, plan, gpu_nodes, cfg, waits_for, after)
            members = [gpu_nodes[name] for name in batch.nodes]
            for gpu_node in members:
                migrate(gpu_node, [*after, gate])
            if finish is not None:
                finish(batch.index, members)
            previous = (batch, members)
        self.budget_release = self._release(plan, cfg, previous, preview)
        self.register_outputs({})

    def _release(self, plan: Plan, cfg: Any, last: Optional[tuple[Batch, list["GpuNode"]]], preview: bool
                 ) -> Optional[shared_budget.SharedBudgetRelease]:
        """With a shared budget: after the last batch, the stack's claim goes (each gate already dropped the claim of
        the batch before it)."""
        shared = self.shared
        if shared is None or last is None:
            return None
        batch = last[0]
        after = list(batch.nodes) if preview else when_done(
            *last, batch.index + 1, stopped=f"the claim of batch {batch.index} in {shared_budget.settings_text(shared)}"
                                            f" stays held")
        return shared_budget.SharedBudgetRelease(
            "shared-budget-release", kubeconfig=cfg.kubeconfig, shared=shared, plan=plan_fingerprint(plan, cfg),
            after=after, opts=pulumi.ResourceOptions(parent=self))

    def _gate(self, batch: Batch, plan: Plan, gpu_nodes: dict[str, "GpuNode"], cfg: Any, waits_for: Any,
              after: list[pulumi.Resource]) -> capacity_gate.CapacityGate:
        gate = capacity_gate.CapacityGate(
            batch.gate_name,
            kubeconfig=cfg.kubeconfig,
            index=batch.index,
            batch=batch.nodes,
            stages={name: gpu_nodes[name].node.stage for name in batch.nodes},
            kube_version=cfg.kube_version,
            after=waits_for,
            selector=cfg.gpu_node_selector,
            min_available=plan.budget.min_available,
            soak_seconds=batch.soak_seconds,
            timeout=cfg.timeouts.capacity_gate,
            poll_interval=cfg.timeouts.poll_interval,
            shared=self.shared,
            opts=pulumi.ResourceOptions(parent=self, depends_on=after, aliases=WAS_AT_ROOT),
        )
        self.gates.append(gate)
        return gate
