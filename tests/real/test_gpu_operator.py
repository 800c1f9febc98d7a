"""The real NVIDIA GPU Operator (its controller built from its Go module, run by the local container runtime for the
chart's operator pod) against the real API server: what it does to GPU nodes, which the program relies on.

The chart is installed through the program's own Helm release (components/charts.py gpu_operator_release) in a stack
of its own; the nodes are kwok nodes as IKS registers them, NFD's labels come from its worker pod (gpu_doubles.py)."""
import uuid

import pytest
from kubernetes import client

from gpu_migration_local import tools
from iks_gpu_migration.components.charts import gpu_operator_release
from iks_gpu_migration.config.model import HelmChart

from .kube import eventually, kwok_node
from .project import GPU_OPERATOR_CHART_VERSION

NS = "gpu-operator"
DEPLOY = "nvidia.com/gpu.deploy."
OPERANDS, DEVICE_PLUGIN = DEPLOY + "operands", DEPLOY + "device-plugin"


@pytest.fixture
def operator(cluster, project):
    """The chart, installed by the program's release function; uninstalled (and every operand with it) after."""
    import pulumi
    import pulumi_kubernetes as k8s

    def program():
        provider = k8s.Provider("cluster", kubeconfig=str(cluster.kubeconfig))
        chart = HelmChart(chart=str(tools.gpu_operator_chart()), version=GPU_OPERATOR_CHART_VERSION, namespace=NS)
        gpu_operator_release(chart, opts=pulumi.ResourceOptions(provider=provider))

    core = client.CoreV1Api(cluster.api_client)
    # A CPU worker for the operator's and NFD's Deployments: Helm waits (atomic) until they run.
    system = f"10.78.0.{uuid.uuid4().int % 200 + 10}"
    core.create_node(kwok_node(system, {}))
    stack = project.stack("operator", program)
    try:
        stack.up(on_output=print)
        yield core
        stack.destroy(on_output=print)
    finally:
        core.delete_node(system)


def gpu_node(core, labels=None) -> str:
    """A GPU worker as IKS registers it at 1.37: IBM's GPU label, one GPU, no IBM drivers."""
    name = f"10.77.{uuid.uuid4().int % 200}.{uuid.uuid4().int % 200 + 10}"
    core.create_node(kwok_node(name, {"ibm-cloud.kubernetes.io/gpu-enabled": "true", **(labels or {})},
                               {"gpu-migration.local/gpus": "1"}))
    return name


def labels_of(core, node: str) -> dict:
    return core.read_node(node).metadata.labels or {}


def operand_pods(core, node: str) -> set[str]:
    pods = core.list_namespaced_pod(NS, field_selector=f"spec.nodeName={node}").items
    return {p.metadata.labels.get("app", "") for p in pods if p.metadata.deletion_timestamp is None} - {""}


def test_the_real_operator_labels_a_gpu_node_and_runs_its_operands_there(operator):
    core = operator
    node = gpu_node(core)
    try:
        # NFD's worker labels the node, then the operator adds gpu.present and its deploy labels (labelGPUNodes).
        labels = eventually(lambda: (ls := labels_of(core, node)).get(DEVICE_PLUGIN) == "true" and ls,
                            "the operator's deploy labels on the GPU node", timeout=90)
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
        assert labels[DEPLOY + "driver"] == labels[DEPLOY + "container-toolkit"] == "true"
        # Its DaemonSets, which the program's readiness reads, put their pods there; the kubelet double offers the
        # GPU once the device plugin pod runs.
        eventually(lambda: {"nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset",
                            "nvidia-device-plugin-daemonset", "nvidia-operator-validator"} <= operand_pods(core, node),
                   "driver, toolkit, device plugin and validator pods on the node", timeout=90)
        eventually(lambda: core.read_node(node).status.allocatable.get("nvidia.com/gpu") == "1",
                   "nvidia.com/gpu offered through the device plugin", timeout=30)
        owners = {o.kind for ds in client.AppsV1Api(core.api_client).list_namespaced_daemon_set(NS).items
                  for o in ds.metadata.owner_references or []}
        assert owners == {"ClusterPolicy"}, "the DaemonSets are the operator's, not the chart's"
    finally:
        core.delete_node(node)


def test_the_fence_removes_every_state_label_and_operand_and_unfencing_forgets_a_false(operator):
    """`deploy.operands=false` deletes every deploy label, a `false` one too (removeAllGPUStateLabels); once operands
    are allowed again the operator adds the missing ones as `true` (addGPUStateLabels): a `dra` node fenced and then
    un-fenced would get its device plugin back beside the DRA kubelet plugin. The program never fences a node at or
    above 1.36 (kube/fence.py) and never removes the fence of one below (the replacement is a new Node)."""
    core = operator
    node = gpu_node(core)
    try:
        eventually(lambda: "nvidia-device-plugin-daemonset" in operand_pods(core, node), "the device plugin pod",
                   timeout=90)
        core.patch_node(node, {"metadata": {"labels": {DEVICE_PLUGIN: "false"}}})  # as a dra node has it
        eventually(lambda: "nvidia-device-plugin-daemonset" not in operand_pods(core, node),
                   "the device plugin pod gone with deploy.device-plugin=false", timeout=60)
        core.patch_node(node, {"metadata": {"labels": {OPERANDS: "false"}}})
        eventually(lambda: not any(k.startswith(DEPLOY) and k != OPERANDS for k in labels_of(core, node)),
                   "every deploy label removed, device-plugin=false too", timeout=60)
        eventually(lambda: not operand_pods(core, node) & {"nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset"},
                   "driver and toolkit pods gone from the fenced node", timeout=60)
        core.patch_node(node, {"metadata": {"labels": {OPERANDS: None}}})
        eventually(lambda: labels_of(core, node).get(DEVICE_PLUGIN) == "true",
                   "the un-fenced node's device plugin label back as true", timeout=60)
    finally:
        core.delete_node(node)
