"""The runbook's operator checks: no GPU Operator operand on a node that keeps IBM's drivers (OperandPlacement), and the
GPU pods still Pending after a node (PendingGpuPods)."""
from typing import Iterable, Optional, Sequence

import pulumi
from kubernetes import client
from kubernetes.client import ApiClient
from pulumi.dynamic import Resource

from ..common.versions import version_at_least
from .cluster import FENCED_OPERANDS, _operand, requests_resource
from .provider import CheckFailed, _bullets, _EveryUp, _Provider


def pending_gpu_pods(api: ApiClient, resources: Iterable[str]) -> list[str]:
    """Pods requesting a GPU resource that are still Pending, each with its scheduling reason."""
    found = []
    for p in client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector="status.phase=Pending").items:
        if not (p.spec.resource_claims or any(requests_resource(p, r) for r in resources)):
            continue
        reasons = [f"{c.reason}: {c.message}" for c in (p.status.conditions or []) if p.status
                   if c.type == "PodScheduled" and c.status == "False"]
        found.append(f"{p.metadata.namespace}/{p.metadata.name} ({reasons[0] if reasons else 'not yet scheduled'})")
    return sorted(found)


def operand_placement_problems(api: ApiClient, namespace: str, fenced: Iterable[str],
                               operator_min_version: Optional[str] = None) -> list[str]:
    """Driver, device plugin, container toolkit or DCGM exporter pods on a node that must keep IBM's drivers: what
    the runbook checks by hand after installing the operator.

    `fenced` names the nodes as they were fenced; a replaced worker's fence stays in state under the old name, and a
    new worker can get that name again (VPC subnets hand out freed IPs, and IKS names nodes by IP). A node of that
    name whose kubelet is at `operator_min_version` or later is such a new worker: no IBM drivers, nothing to check."""
    fenced = set(fenced)
    per_node: dict[str, list[str]] = {}
    for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items:
        node = p.spec.node_name
        if node in fenced and any(_operand(p, o) for o in FENCED_OPERANDS):
            per_node.setdefault(node, []).append(f"{namespace}/{p.metadata.name}")
    if operator_min_version and per_node:
        kubelets = {n.metadata.name: (n.status.node_info.kubelet_version if n.status and n.status.node_info else None)
                    for n in client.CoreV1Api(api).list_node().items}
        per_node = {n: pods for n, pods in per_node.items()
                    if not version_at_least(kubelets.get(n), operator_min_version)}
    return [f"node {n}: runs IBM-managed drivers but has GPU Operator pods {', '.join(sorted(pods))}; the "
            "operator must not run there (check its nvidia.com/gpu.deploy.operands=false label)"
            for n, pods in sorted(per_node.items())]


class _OperandPlacementProvider(_EveryUp):
    rerun_on = ("namespace", "fenced")

    def run(self, api, p):
        problems = operand_placement_problems(api, p["namespace"], p["fenced"],
                                                          p.get("operator_min_version"))
        if problems:
            raise CheckFailed(f"GPU Operator pods run on nodes with IBM-managed drivers:{_bullets(problems)}\n"
                              "stop: uninstall or fix the fence labels before going on")
        return {"checked": sorted(p["fenced"])}


class OperandPlacement(Resource, module="gpu-migration", name="OperandPlacement"):
    """No driver, device plugin, container toolkit or DCGM exporter pod on a fenced or ibm-managed node."""

    checked: pulumi.Output[list[str]]

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], namespace: str,
                 fenced: pulumi.Input[Sequence[pulumi.Input[str]]], operator_min_version: Optional[str] = None,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = dict(kubeconfig=kubeconfig, namespace=namespace, fenced=fenced,
                     operator_min_version=operator_min_version, checked=None)
        super().__init__(_OperandPlacementProvider(), name, props, opts)


class _PendingGpuPodsProvider(_Provider):
    rerun_on = ("node", "resources", "gate")

    def run(self, api, p):
        pending = pending_gpu_pods(api, p["resources"])
        if pending and p.get("gate"):
            raise CheckFailed(f"after node {p['node']}, GPU pods are still Pending (pendingGpuPodsGate is true):"
                              f"{_bullets(pending)}")
        if pending:
            pulumi.log.warn(f"after node {p['node']}, GPU pods still Pending:{_bullets(pending)}")
        return {"pending": pending}


class PendingGpuPods(Resource, module="gpu-migration", name="PendingGpuPods"):
    """After a node: the GPU pods still Pending, with their scheduling reason (a gate with pendingGpuPodsGate)."""

    pending: pulumi.Output[list[str]]

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], node: pulumi.Input[str],
                 resources: list[str], gate: bool, opts: Optional[pulumi.ResourceOptions] = None):
        props = dict(kubeconfig=kubeconfig, node=node, resources=resources, gate=gate, pending=None)
        super().__init__(_PendingGpuPodsProvider(), name, props, opts)
