"""Declares the plan's batches: a CapacityGate per batch, the batch's nodes after it, the next batch after them.

Why the order between batches is not a `depends_on` chain: the Python SDK checks every new dependency for cycles by
walking all transitive dependencies recursively (pulumi/runtime/resource_cycle_breaker.py `_reachable`, called from
runtime/rpc.py `_add_dependency` for depends_on and for every resource an input Output carries). A chain through all
nodes makes that walk O(n) per edge, O(n^2) per program, and recursion O(n) deep: 1000 nodes raised RecursionError.

Instead the next batch's gate takes an input (`after`) whose future resolves only once every node of the previous
batch is done, and which carries no resources. The SDK registers a resource only after its inputs resolve, and the
engine answers RegisterResource only once the step finished, so batch i+1 reaches the engine after batch i is done,
while the dependency graph stays a constant depth per node. A failed node makes that future fail: the next gate is
never registered, later batches never start, and nodes already running finish (the engine lets in-flight steps end).
In preview nothing runs, so the gates get the same value (the previous batch's configured names) at once instead of
waiting for the previous batch's registrations: preview stays O(n) even at one node per batch, and shows every batch.
"""
import asyncio
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import pulumi

from . import capacity_gate
from .plan import Batch, Plan

if TYPE_CHECKING:
    from .migration import GpuNode


class BatchStopped(RuntimeError):
    """A node of the previous batch failed, so this batch was not started."""


def _resolved(value: bool) -> asyncio.Future:
    future = asyncio.get_event_loop().create_future()  # a future, not a coroutine: never "never awaited"
    future.set_result(value)
    return future


def when_done(batch: Batch, nodes: Sequence["GpuNode"], next_index: int) -> pulumi.Output:
    """`batch.nodes` (the configured names, the same value preview shows), resolved only once every node of the batch
    is done; carries no resources on purpose (see the module docstring)."""

    async def wait() -> list[str]:
        for gpu_node in nodes:
            try:  # the node's last checks before the next batch may go (GpuNode.done_by)
                for resource in gpu_node.done_by:
                    await resource.urn.future()
            except BatchStopped:
                raise  # an earlier batch failed: say so once, not nested per batch
            except Exception as e:  # noqa: BLE001 - any failure of the node stops later batches
                raise BatchStopped(
                    f"batch {next_index} and later were not started: node {gpu_node.node.name} of batch "
                    f"{batch.index} did not finish ({e}); fix it and run `pulumi up` again "
                    f"(finished nodes are not redone)"
                ) from None
        return list(batch.nodes)

    return pulumi.Output(set(), asyncio.ensure_future(wait()), is_known=_resolved(True),
                         is_secret=_resolved(False))


def detached(output: pulumi.Output) -> pulumi.Output:
    """`output`'s value without the resources it carries: for an input every node gets (e.g. the fenced node names,
    which carry every fence), so the graph keeps a constant number of edges per node. Only for values whose
    resources every receiver already follows through another dependency (see the module docstring)."""
    return pulumi.Output(set(), asyncio.ensure_future(output.future(with_unknowns=True)), is_known=_resolved(True),
                         is_secret=_resolved(False))


def once_done(value: Any, resources: Sequence[pulumi.Resource]) -> pulumi.Output:
    """`value`, resolved only once every resource in `resources` is registered (in `up`: its step finished), carrying
    none of them. For what every node waits for (the GPU Operator, which depends on every node's fence): a real edge
    makes the SDK's cycle check walk the operator's n fences for each node, O(n^2) (see the module docstring)."""
    async def wait() -> Any:
        for resource in resources:
            await resource.urn.future()
        return value

    return pulumi.Output(set(), asyncio.ensure_future(wait()), is_known=_resolved(True), is_secret=_resolved(False))


def declare_batches(plan: Plan, gpu_nodes: dict[str, "GpuNode"], cfg: Any, after: list[pulumi.Resource],
                    migrate: Callable[["GpuNode", list[pulumi.Resource]], None],
                    first_after: Optional[pulumi.Output] = None,
                    finish: Optional[Callable[[int, list["GpuNode"]], None]] = None) -> list[capacity_gate.CapacityGate]:
    """One gate per batch; each node of the batch migrates (`migrate(node, after)`) after its gate and `after`
    (inventory, master, temporary pool). `first_after` (a `once_done([], ...)` value) holds the first gate back
    without a dependency edge, e.g. until the GPU Operator runs on the temporary pool. `finish(index, members)`
    declares what verifies a batch once its nodes are declared (before the next batch's gate waits for them)."""
    gates = []
    previous: Optional[tuple[Batch, list["GpuNode"]]] = None
    preview = pulumi.runtime.is_dry_run()
    for batch in plan.batches:
        if previous is None and first_after is not None:
            waits_for: Any = first_after
        elif preview or previous is None:
            waits_for = list(batch.after)
        else:  # made only when a later batch awaits it (an unawaited failure would be reported twice)
            waits_for = when_done(*previous, batch.index)
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
            opts=pulumi.ResourceOptions(depends_on=after),
        )
        gates.append(gate)
        members = [gpu_nodes[name] for name in batch.nodes]
        for gpu_node in members:
            migrate(gpu_node, [*after, gate])
        if finish is not None:
            finish(batch.index, members)
        previous = (batch, members)
    return gates
