"""OperatorReadiness: a replaced node's GPU Operator operands run and its GPUs are offered on its stage's path; then
the runbook's two checks after a node (kube/operands.py): no operand on a node that keeps IBM's drivers, and the GPU
pods still Pending. One resource for the three: each resource costs every state save its whole size, per node."""
from typing import Optional

import pulumi
from kubernetes import client
from kubernetes.client import ApiClient
from pulumi.dynamic import Resource

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


class _OperatorReadinessProvider(_Provider):
    rerun_on = ("node", "stage", "namespace", "driver", "device_plugin_resource", "dra_namespace", "resources", "gate")
    # Inputs since the placement and pending checks moved in here. A readiness recorded before ran next to those
    # checks as resources of their own (deleted by the same `up`): nothing to run again for them.
    ABSORBED = ("operator_min_version", "resources", "gate")

    def diff(self, _id, olds, news):
        if "resources" not in olds:
            olds = {**olds, **{k: news.get(k) for k in self.ABSORBED}}
        return super().diff(_id, olds, news)

    def run(self, api, p):
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


class OperatorReadiness(Resource, module="gpu-migration", name="OperatorReadiness"):
    """Waits until the node's operand pods run/completed and its GPUs are allocatable on the stage's path; then checks
    operand placement (with `operator_min_version`) and lists the GPU pods (`resources`) still Pending (`pending`;
    with `gate`, any stops `up`)."""

    ready: pulumi.Output[bool]
    pending: pulumi.Output[list[str]]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        node: pulumi.Input[str],
        stage: pulumi.Input[str],
        namespace: pulumi.Input[str],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        driver: pulumi.Input[Optional[str]] = None,  # dra stage: count only this driver's devices
        device_plugin_resource: pulumi.Input[Optional[str]] = None,  # device-plugin stage: default nvidia.com/gpu
        dra_namespace: pulumi.Input[Optional[str]] = None,  # dra stage: the DRA kubelet plugin pod must be Ready
        config_name: Optional[str] = None,  # the node's name in gpu-migration:nodes, recorded on the node
        operator_min_version: Optional[str] = None,  # operand placement: nodes below it keep IBM's drivers
        resources: Optional[list[str]] = None,  # GPU resources whose Pending pods are listed after the node
        gate: bool = False,  # pendingGpuPodsGate: a Pending GPU pod stops `up`
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, node=node, stage=stage, namespace=namespace, driver=driver,
                     device_plugin_resource=device_plugin_resource, dra_namespace=dra_namespace,
                     config_name=config_name, operator_min_version=operator_min_version,
                     resources=resources or [], gate=gate, timeout=timeout,
                     poll_interval=poll_interval, ready=None, pending=None)
        super().__init__(_OperatorReadinessProvider(), name, props, opts)
