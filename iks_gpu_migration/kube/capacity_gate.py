"""CapacityGate: a node of the plan starts only when the cluster can spare it.

Registered once the node has a slot (components/slots.py); reads every Node with the official kubernetes client and
opens once, with the node and the nodes in flight beside it (`slot.peers`) out, at least `min_available` GPU nodes
(matching gpuNodeSelector) are Ready and schedulable (plan.gate_decision): nodes cordoned, NotReady or gone for any
reason - maintenance, a node migrating outside this run, a node broken before the run - count against the budget, so
such nodes take slots (Karpenter: allowed disruptions = budget - deleting - NotReady). The node and its peers are found
by name or, once replaced (renamed), by the config entry their readiness check recorded on the Node. Waits (after the
soak, when a node's end freed the slot) bounded by timeouts.capacityGate, logging what it counts; a timeout names the
unavailable nodes and leaves the node untouched.

Re-runs (replace) when its node, its stage, the budget or kubeVersion change, so dra switches and the replacements of
a kubeVersion bump are gated like first replacements; an unchanged gate keeps its record, so a resumed `up` does not
wait or soak again (the slot is an input that steers a run only: which nodes are in flight differs every run); each
node checks the budget again right before its drain (kube/drain_budget.py), on every run.
"""
import time
from typing import Any, Optional, Sequence

import pulumi
from kubernetes import client
from pulumi.dynamic import DiffResult, Resource

from .. import plan
from ..common.coalesced import READS
from ..common.waiting import WaitTimeout, wait_for
from . import finished, shared_budget
from .cluster import GPU_RESOURCE, raw_items
from .provider import CheckFailed, _Provider, _timing
from .records import CONFIG_NAME_ANNOTATION


def node_views(core: client.CoreV1Api) -> list[plan.NodeView]:
    """Every Node as the budget sees it, read as plain JSON (cluster.raw_items: each drain of a batch reads every
    Node again). Ready: the kubelet's NodeReady condition is True (k8s.io/api core/v1 types.go NodeReady; a node
    without it has not reported and counts as not ready, as the node lifecycle controller treats it as Unknown).
    One read for the batch's drains that ask at once (common/coalesced.py)."""
    return list(READS.call(("node-views", id(core.api_client)),
                           lambda: [node_view(n) for n in raw_items(core.list_node(_preload_content=False))]))


def node_view(node: dict) -> plan.NodeView:
    status, meta = node.get("status") or {}, node["metadata"]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    resources = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    # Cordoned is cordoned, whoever did it (also this program, CORDON_ANNOTATION): such a node takes no GPU pods.
    return plan.NodeView(meta["name"], dict(meta.get("labels") or {}),
                         bool((node.get("spec") or {}).get("unschedulable")), ready,
                         (meta.get("annotations") or {}).get(CONFIG_NAME_ANNOTATION, ""), GPU_RESOURCE in resources)


class _CapacityGateProvider(_Provider):
    # kube_version: a kubeVersion bump replaces every migrated worker again, each behind its gate (issue 10).
    rerun_on = ("batch", "stages", "min_available", "selector", "kube_version")
    # The rest steers a run only: the slot (nodes in flight, the node that freed it) differs every run; the node's
    # position, the timeouts and the shared budget's settings (its stack's node count) change when other entries do.
    kept = (*rerun_on, "kubeconfig")

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A gate leaves nothing behind: the new one may check before the old record goes (no delete first).
        if (olds.get("selector"), news.get("selector")) == (plan.LEGACY_DEFAULT_GPU_NODE_SELECTOR,
                                                           plan.DEFAULT_GPU_NODE_SELECTOR):
            # The default grew by IKS's GPU label (it matches every node the old one did and the GPU nodes still on
            # IBM's drivers): a gate recorded with the old default is not run again for it.
            olds = {**olds, "selector": news["selector"]}
        result = super().diff(_id, olds, news)
        return DiffResult(changes=result.changes, replaces=result.replaces, delete_before_replace=False)

    def run(self, api, p):
        p = {**p, "index": int(p["index"])}  # numbers come back from the engine as floats
        slot = p.get("slot") or {}
        peers = [n for n in slot.get("peers") or [] if n not in p["batch"]]
        what = f"capacity for node {', '.join(p['batch'])}" + (f" beside {len(peers)} in flight ({', '.join(peers)})"
                                                              if peers else "")
        soak = float(p.get("soak_seconds") or 0)
        if soak and slot.get("freed_by"):
            started = time.monotonic()
            wait_for(f"soak of {soak:g}s after node {slot['freed_by']} before {what}",
                     lambda: (time.monotonic() - started >= soak, None, "soaking"),
                     timeout=soak + 60, interval=min(soak, float(p.get("poll_interval") or 15)))
        shared, held_back = p.get("shared"), {"locally": True}

        def poll():
            views = node_views(client.CoreV1Api(api))
            # The peers done since its slot came count as what they are again (kube/finished.py).
            members = [*p["batch"], *finished.in_flight(peers, views)]
            decision = plan.gate_decision(views, members, p["selector"], int(p["min_available"]))
            held_back["locally"] = not decision.open
            if not shared:
                return decision.open, decision, decision.state
            # The shared budget after the stack's own: a node claims room there only once it may go out here; the
            # stack's claim becomes the node and its peers (the nodes no longer in flight leave it). The fleet's
            # unavailable GPU nodes count there whichever stack (or nobody) took them out.
            admission = shared_budget.try_admit(api, shared, p["index"], members, decision.open, views,
                                                p["selector"], p.get("kubeconfig"))
            return decision.open and admission.open, decision, f"{decision.state}; {admission.state}"

        try:
            decision = wait_for(what, poll, **_timing(p, 3600))
        except WaitTimeout as e:
            advice = ("Make the unavailable GPU nodes available (uncordon or repair them), raise "
                      "gpu-migration:maxUnavailable, or enable gpu-migration:tempGpuPool for surge capacity, then "
                      "run `pulumi up` again" if held_back["locally"] else shared_budget.timeout_advice(shared))
            raise CheckFailed(f"{e}\nnode {', '.join(p['batch'])} was not started, nothing of it was changed. "
                              f"{advice}") from None
        pulumi.log.info(f"node {', '.join(p['batch'])} starts: {decision.state}")
        if decision.missed_count:  # counted short, so never too many out: go on, but say whom the budget misses
            pulumi.log.warn(f"node {', '.join(p['batch'])}: the capacity budget does not count every GPU node"
                            f"{decision.missed_text}")
        return {"opened": decision.state}


class CapacityGate(Resource, module="gpu-migration", name="CapacityGate"):
    """Opens when the cluster keeps `min_available` GPU nodes available with `batch` (the node) and `slot["peers"]`
    (the nodes in flight beside it) out; the node's steps depend on it."""

    opened: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        index: int,
        batch: Sequence[str],
        stages: dict[str, str],
        kube_version: str,
        after: pulumi.Input[Sequence[str]],
        selector: str,
        min_available: int,
        soak_seconds: float,
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        shared: Optional[dict[str, Any]] = None,
        slot: Optional[pulumi.Input[dict]] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props: dict[str, Any] = dict(kubeconfig=kubeconfig, index=index, batch=list(batch), stages=stages,
                                     kube_version=kube_version, after=after, selector=selector,
                                     min_available=min_available,
                                     soak_seconds=soak_seconds, timeout=timeout, poll_interval=poll_interval,
                                     opened=None)
        if shared:  # only then: the gates of stacks without one keep their inputs (no diff)
            props["shared"] = shared
        if slot is not None:  # components/slots.py: {"peers": [...], "freed_by": name or ""}
            props["slot"] = slot
        super().__init__(_CapacityGateProvider(), name, props, opts)
