"""Right before each node's drain: the capacity budget again, as the cluster is at that moment (issue 17).

The CapacityGate admitted the node (with the nodes in flight beside it: its `batch`) once; between then and this
node's drain other GPU nodes may have gone NotReady or been cordoned (maintenance, a migration outside this run, a dra
node held for its smoke test). So the gate's decision is taken again (plan.drain_decision): the node and the nodes in
flight when it was admitted (those not finished since) are out by admission, only what is unavailable beyond them
counts. WorkerReplacementProvider calls this each time a replacement is about to drain, also on a resumed `up` (a gate
recorded by an earlier run is not run again); a replacement whose replaceWorker was already requested does not drain,
so it never waits here (its node is out already).

With a shared budget (gpu-migration:sharedBudget) the fleet's budget is asked again too: the stack's claim must
cover the batch (a resumed stack whose claim expired or was dropped claims it again here), and the fleet's GPU nodes
that went down since the gate count (kube/shared_budget.py try_admit).

Waits bounded by timeouts.capacityGate, logging what it counts; a timeout names the unavailable nodes, and nothing
was drained or replaced.
"""
from typing import Any

import pulumi

from .. import plan
from ..common.waiting import WaitTimeout, optional_float, wait_for


class BudgetExceeded(RuntimeError):
    """Too few GPU nodes outside the batch are available to drain this node now; nothing was drained or replaced."""


def hold_for_budget(node: str, settings: dict[str, Any]) -> None:
    """Returns once `node` may be drained; a no-op without `settings["budget"]` (a replacement declared without
    one). `settings`: the eviction settings (kubeconfig) with `budget`: {index, batch, selector, min_available,
    timeout, poll_interval, shared (a shared budget's settings, if any)} (components/migration.py drain_budgets)."""
    budget = settings.get("budget")
    if not budget:
        return
    from kubernetes import client  # kubernetes is only needed when a node is drained

    from . import finished, shared_budget
    from .capacity_gate import node_views
    from .clients import api_client

    batch, selector, needed = list(budget["batch"]), budget["selector"], int(budget["min_available"])
    shared = budget.get("shared")
    what = f"capacity to drain node {node}" + (f" beside {', '.join(b for b in batch if b != node)} in flight"
                                              if len(batch) > 1 else "")
    with api_client(settings.get("kubeconfig")) as api:
        core = client.CoreV1Api(api)

        def poll() -> tuple[bool, plan.GateDecision, str]:
            views = node_views(core)
            # The node and the nodes in flight beside it when its gate opened, without those done since.
            members = [batch[0], *finished.in_flight(batch[1:], views)] if batch else batch
            decision = plan.drain_decision(views, node, members, selector, needed)
            if not decision.open or not shared:
                return decision.open, decision, decision.state
            # The shared budget again, as the fleet is now: the stack's claim must cover the batch (a resumed stack
            # whose claim expired or was dropped claims it again here, before anything of it is drained).
            admission = shared_budget.try_admit(api, shared, int(budget.get("index") or 0), batch, True, views,
                                                selector, settings.get("kubeconfig"), merge=True)
            return admission.open, decision, f"{decision.state}; {admission.state}"

        try:
            decision = wait_for(what, poll, optional_float(budget.get("timeout"), 3600),
                                optional_float(budget.get("poll_interval"), 15))
        except WaitTimeout as e:
            shared_advice = f" {shared_budget.timeout_advice(shared)}" if shared else ""
            raise BudgetExceeded(
                f"{e}\nnode {node} was not drained and its worker not replaced: GPU nodes outside its batch became "
                f"unavailable after the batch's capacity gate. Make them available (uncordon or repair them), raise "
                f"gpu-migration:maxUnavailable, or enable gpu-migration:tempGpuPool for surge capacity, then run "
                f"`pulumi up` again.{shared_advice}"
            ) from None
    pulumi.log.info(f"node {node} may be drained: {decision.state}")
