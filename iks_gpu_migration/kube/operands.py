"""The runbook's operator checks: no GPU Operator operand on a node that keeps IBM's drivers (OperandPlacement, once
for the cluster on every `up`; after each node, kube/readiness.py), and the GPU pods still Pending after a node."""
from typing import Iterable, Optional

import pulumi
from kubernetes import client
from kubernetes.client import ApiClient
from pulumi.dynamic import Resource

from ..common.coalesced import READS
from ..common.versions import version_at_least
from .cluster import FENCED_OPERANDS, is_operand, raw_items, requests_resource
from .provider import CheckFailed, _bullets, _EveryUp, _Provider


def pending_gpu_pods(api: ApiClient, resources: Iterable[str]) -> list[str]:
    """Pods requesting a GPU resource that are still Pending, each with its scheduling reason (one read for the
    batch-mates that ask at once: common/coalesced.py)."""
    resources = tuple(resources)
    return list(READS.call(("pending-gpu-pods", id(api), resources), lambda: _pending_gpu_pods(api, resources)))


def _pending_gpu_pods(api: ApiClient, resources: Iterable[str]) -> list[str]:
    found = []
    for p in client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector="status.phase=Pending").items:
        if not (p.spec.resource_claims or any(requests_resource(p, r) for r in resources)):
            continue
        reasons = [f"{c.reason}: {c.message}" for c in (p.status.conditions or []) if p.status
                   if c.type == "PodScheduled" and c.status == "False"]
        found.append(f"{p.metadata.namespace}/{p.metadata.name} ({reasons[0] if reasons else 'not yet scheduled'})")
    return sorted(found)


def operand_placement_problems(api: ApiClient, namespace: str, operator_min_version: str) -> list[str]:
    """Driver, device plugin, container toolkit or DCGM exporter pods on a node that keeps IBM's drivers: what the
    runbook checks by hand after installing the operator.

    Those are the nodes whose kubelet is below `operator_min_version`: IKS installs its NVIDIA drivers on GPU workers
    below 1.36 and on none at or above it (iks_gpu_migration/config: OPERATOR_MIN_VERSION). Read from the cluster,
    not from the fence list: the check needs no per-node copy of the fleet's names in the state, a new worker that
    got a fenced node's name again (VPC subnets hand out freed IPs, and IKS names nodes by IP) is not mistaken for
    it, and a node whose fence label was removed is still caught. A pod bound to a node that is gone runs nowhere.
    After each node of a batch: one read for the batch-mates that ask at once (common/coalesced.py)."""
    return list(READS.call(("operand-placement", id(api), namespace, operator_min_version),
                           lambda: _operand_placement_problems(api, namespace, operator_min_version)))


def _operand_placement_problems(api: ApiClient, namespace: str, operator_min_version: str) -> list[str]:
    core = client.CoreV1Api(api)
    per_node: dict[str, list[str]] = {}
    for p in raw_items(core.list_namespaced_pod(namespace, _preload_content=False)):
        name, node = p["metadata"]["name"], (p.get("spec") or {}).get("nodeName")
        if node and any(is_operand(name, o) for o in FENCED_OPERANDS):
            per_node.setdefault(node, []).append(f"{namespace}/{name}")
    if not per_node:
        return []
    kubelets = {n["metadata"]["name"]: ((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
                for n in raw_items(core.list_node(_preload_content=False))}
    return [f"node {n}: runs IBM-managed drivers (kubelet {kubelets[n] or 'unknown'}, below "
            f"{operator_min_version}) but has GPU Operator pods {', '.join(sorted(pods))}; the operator must not "
            "run there (check its nvidia.com/gpu.deploy.operands=false label)"
            for n, pods in sorted(per_node.items())
            if n in kubelets and not version_at_least(kubelets[n], operator_min_version)]


def check_operand_placement(api: ApiClient, namespace: str, operator_min_version: str) -> str:
    """operand_placement_problems, or CheckFailed naming each node and its pods."""
    problems = operand_placement_problems(api, namespace, operator_min_version)
    if problems:
        raise CheckFailed(f"GPU Operator pods run on nodes with IBM-managed drivers:{_bullets(problems)}\n"
                          "stop: uninstall or fix the fence labels before going on")
    return f"no operand on a node below {operator_min_version}"


class _OperandPlacementProvider(_EveryUp):
    def run(self, api, p):
        return {"checked": check_operand_placement(api, p["namespace"], p.get("operator_min_version") or "1.36")}


class OperandPlacement(Resource, module="gpu-migration", name="OperandPlacement"):
    """No driver, device plugin, container toolkit or DCGM exporter pod on a node that keeps IBM's drivers. Its
    state is the same size whatever the fleet's (no node names)."""

    checked: pulumi.Output[str]

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], namespace: str,
                 operator_min_version: str, opts: Optional[pulumi.ResourceOptions] = None):
        props = dict(kubeconfig=kubeconfig, namespace=namespace, operator_min_version=operator_min_version,
                     checked=None)
        super().__init__(_OperandPlacementProvider(), name, props, opts)


class _PendingGpuPodsProvider(_Provider):
    """Retired: each node's `<node>-pending-gpu-pods` is now a step of its path switch (kube/switch.py). Kept so
    that the next `up` of a stack deployed before can delete those resources (their pickled provider names this
    class; deleting a check changes nothing)."""

    def run(self, api, p):
        return {}
