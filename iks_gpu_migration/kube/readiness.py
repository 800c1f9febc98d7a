"""A replaced node's readiness: its GPU Operator operands run and its GPUs are offered on its stage's path; then the
runbook's two checks after a node (kube/operands.py): no operand on a node that keeps IBM's drivers, and the GPU pods
still Pending. Run by the node's path switch (kube/switch.py), as its last step: each resource costs every state save
its whole size, per node."""
from typing import Optional

import pulumi
from kubernetes import client
from kubernetes.client import ApiClient

from .cluster import DRIVER_POD, GPU_RESOURCE, TOOLKIT_POD, _operand, allocatable, devices_per_node, kubelet_plugin_pods, pod_not_ready
from .operands import check_operand_placement, pending_gpu_pods
from .provider import CheckFailed, _bullets, _Provider, _wait_until_no_problems
from .records import CONFIG_NAME_ANNOTATION


def operator_ready(
    api: ApiClient, node: str, namespace: str, stage: str, driver: Optional[str] = None, resource: str = GPU_RESOURCE,
    dra_namespace: Optional[str] = None,
) -> list[str]:
    """The node's GPUs are usable on its stage's path.

    device-plugin: every GPU Operator pod on the node running/completed, and `resource` allocatable.
    dra: only the operands that must run there: driver and toolkit Ready, the DRA kubelet plugin Ready, and DRA
    devices published. Not "all pods": the operator validator's plugin-validation init container waits for
    nvidia.com/gpu capacity, which a node without the device plugin never gets, so it loops there
    (NVIDIA/gpu-operator cmd/nvidia-validator/main.go)."""
    core = client.CoreV1Api(api)
    problems = []
    pods = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    if stage == "dra":
        for operand in (DRIVER_POD, TOOLKIT_POD):
            mine = [p for p in pods if _operand(p, operand)]
            if not mine:
                problems.append(f"node {node}: no {operand} pod in namespace {namespace}")
            problems += [f"node {node}: pod {namespace}/{p.metadata.name} {state}"
                         for p in mine if (state := pod_not_ready(p))]
        if dra_namespace:
            plugins = kubelet_plugin_pods(api, dra_namespace, node)
            if not plugins:
                problems.append(f"node {node}: no DRA kubelet plugin pod in namespace {dra_namespace}")
            problems += [f"node {node}: pod {dra_namespace}/{p.metadata.name} {state}"
                         for p in plugins if (state := pod_not_ready(p))]
        if not devices_per_node(api, driver).get(node):
            problems.append(f"node {node}: no DRA devices in ResourceSlices{f' of driver {driver}' if driver else ''}")
        return problems
    if not pods:
        problems.append(f"node {node}: no GPU Operator pods in namespace {namespace}")
    for pod in pods:
        if state := pod_not_ready(pod):
            problems.append(f"node {node}: pod {namespace}/{pod.metadata.name} {state}")
    if not allocatable(core.read_node(node), resource):
        problems.append(f"node {node}: {resource} allocatable is 0 (device plugin not serving)")
    return problems


def check_readiness(api: ApiClient, p: dict) -> dict:
    """Ties the node to its config entry, waits (bounded) for operator_ready, then after_node. `p`: node, stage,
    namespace (the GPU Operator's), driver, device_plugin_resource, dra_namespace, config_name, operator_min_version,
    resources, gate, timeout, poll_interval."""
    if p.get("config_name"):  # lets GpuNodeInventory tie a replaced node (new name) to its config entry
        body = {"metadata": {"annotations": {CONFIG_NAME_ANNOTATION: p["config_name"]}}}
        client.CoreV1Api(api).patch_node(p["node"], body)
    resource = p.get("device_plugin_resource") or GPU_RESOURCE
    check = lambda: operator_ready(api, p["node"], p["namespace"], p["stage"], p.get("driver"), resource,
                                   p.get("dra_namespace"))
    _wait_until_no_problems(f"GPU Operator on node {p['node']} ({p['stage']})", check, p, 1800)
    return {"ready": True, "pending": after_node(api, p)}


def after_node(api: ApiClient, p: dict) -> list[str]:
    """Once the node is ready: operands start asynchronously after the install, so their placement is checked again
    (every operator namespace pod against every node's kubelet); then the GPU pods still Pending (the runbook expects
    Pending GPU workloads to run once a node's driver is in): a warning, or a stop with pendingGpuPodsGate."""
    if p.get("operator_min_version"):
        check_operand_placement(api, p["namespace"], p["operator_min_version"])
    pending = pending_gpu_pods(api, p.get("resources") or [])
    if pending and p.get("gate"):
        raise CheckFailed(f"after node {p['node']}, GPU pods are still Pending (pendingGpuPodsGate is true):"
                          f"{_bullets(pending)}")
    if pending:
        pulumi.log.warn(f"after node {p['node']}, GPU pods still Pending:{_bullets(pending)}")
    return pending


class _OperatorReadinessProvider(_Provider):
    """Retired: each node's readiness is checked by its path switch now (kube/switch.py NodePathSwitch). Kept so the
    next `up` of a stack deployed before can delete its `<node>-operator-ready` (the pickled provider names this
    class; deleting a check changes nothing in the cluster)."""
    rerun_on = ("node", "stage", "namespace", "driver", "device_plugin_resource", "dra_namespace")

    def run(self, api, p):
        return check_readiness(api, p)
