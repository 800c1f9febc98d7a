"""The slots of a rollout while `up` runs: plan/slots.py decides, this module feeds it the engine's answers.

Each node's turn is an Output that resolves (to the nodes in flight beside it and the node that freed its slot) when
plan/slots.py lets it start; its gate takes that Output as an input, so the SDK registers the gate only then. Why this
avoids a deadlock with the engine's `--parallel` (docs/fleet-scale.md): a node waiting for a slot has no step
registered, so it holds none of the engine's steps; the at most `slots` nodes in flight each run one step at a time,
so `--parallel` >= slots + PARALLEL_HEADROOM always leaves them a step, and a smaller `--parallel` only makes them
take turns (rollout.show warns once).

A node is done when its last checks are registered (GpuNode.done_by: the engine answers RegisterResource once the
step finished), or failed when one of them fails; the Outputs carry no resources (sdk_workarounds.edge_free): the
next gate waits for a slot, not on a dependency edge through every node (O(n) deep: RecursionError at 1000 nodes).
In preview nothing runs: every turn resolves at once, with no peers.

Nodes an earlier `up` left out (it was killed, or stopped, while they were in flight: drained and still cordoned, or
their worker being replaced; the inventory's `resume_first`) take the first slots, ahead of config order, and still
take slots after a failure (plan/slots.py `resumed`): they are out already, and a stop before their turn would
otherwise leave them cordoned (their replacement, which uncordons a node it drained but never replaced, would never
run).
"""
import asyncio
from typing import TYPE_CHECKING, Any, Optional, Sequence

import pulumi

from ..plan import Plan
from ..plan.slots import Slots, Start
from ..sdk_workarounds import edge_free

if TYPE_CHECKING:
    from .gpu_node import GpuNode


class NodeStopped(RuntimeError):
    """A node failed, so this node was not started."""


class SlotTurns:
    """One Output per node (`turn(name)`), resolved when the node may start; `watch(nodes)` once every node's
    resources are declared; `all_done()`, resolved once every node is done (fails if one failed)."""

    def __init__(self, plan: Plan, preview: bool, first_after: Optional[pulumi.Output] = None,
                 resume_first: Optional[pulumi.Output] = None):
        self.plan, self.preview, self.first_after, self.resume_first = plan, preview, first_after, resume_first
        self.slots = Slots([t.node for t in plan.batches], plan.slots)
        loop = asyncio.get_event_loop()
        self._turns: dict[str, asyncio.Future] = {t.node: loop.create_future() for t in plan.batches}
        self._all_done: asyncio.Future = loop.create_future()

    def turn(self, node: str) -> pulumi.Output:
        """{"peers": [...], "freed_by": name or ""} once `node` may start (after `first_after`, if any)."""
        async def wait() -> dict[str, Any]:
            if self.first_after is not None:
                await self.first_after.future()
            start: Start = await self._turns[node]
            return {"peers": list(start.peers), "freed_by": start.freed_by or ""}

        return edge_free(wait())

    def all_done(self) -> pulumi.Output:
        async def wait() -> list[str]:
            return await self._all_done

        return edge_free(wait())

    def watch(self, nodes: Sequence["GpuNode"]) -> None:
        """Start: the first `slots` nodes go; each node's end lets the next ones go."""
        if self.preview:
            for name, future in self._turns.items():
                future.set_result(Start(name, (), None))
            self._all_done.set_result([t.node for t in self.plan.batches])
            return
        asyncio.ensure_future(self._begin(nodes))

    async def _begin(self, nodes: Sequence["GpuNode"]) -> None:
        if self.resume_first is not None:
            try:
                held = set(await self.resume_first.future() or ())
            except Exception as e:  # noqa: BLE001 - the inventory failed: nothing starts (its own error names why)
                self.slots.stopped = f"the GPU node inventory did not pass ({' '.join(str(e).split())[:200]})"
                self._stop()
                self._check_finished()
                return
            self.slots = Slots(self.slots.order, self.slots.slots, resumed=frozenset(held))
        self._grant(self.slots.starts())
        for gpu_node in nodes:
            asyncio.ensure_future(self._follow(gpu_node))
        self._check_finished()

    async def _follow(self, gpu_node: "GpuNode") -> None:
        name = gpu_node.node.name
        try:
            for resource in gpu_node.done_by:
                await resource.urn.future()
        except NodeStopped:
            return  # never started: the node that stopped it is named once, in its own error
        except Exception as e:  # noqa: BLE001 - any failure of a started node stops the nodes not yet started
            starts = self.slots.fail(name, " ".join(str(e).split())[:300] or type(e).__name__)
            self._stop()
            self._grant(starts)
        else:
            self._grant(self.slots.finish(name))
        self._check_finished()

    def _grant(self, starts: list[Start]) -> None:
        for start in starts:
            self._turns[start.node].set_result(start)

    def _stop(self) -> None:
        """Every node not yet started fails its turn, naming the node that failed and what to do."""
        error = NodeStopped(f"{self.slots.stopped}: the nodes not yet started were not started "
                            f"({len(self.slots.never_started)}); fix it and run `pulumi up` again (finished nodes are "
                            f"not redone)")
        for name in self.slots.never_started:
            future = self._turns[name]
            if not future.done():
                future.set_exception(error)
                # Read here too: a turn nobody awaits (its gate failed otherwise) must not be reported as unretrieved.
                future.exception()

    def _check_finished(self) -> None:
        if self._all_done.done() or not self.slots.finished():
            return
        if self.slots.stopped:  # a failure, or the inventory's, stopped the rest
            self._all_done.set_exception(NodeStopped(f"{self.slots.stopped}"))
            self._all_done.exception()
        else:
            self._all_done.set_result(list(self.slots.done))
