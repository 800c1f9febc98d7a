"""NodeFence: keeps the GPU Operator off a node that still runs IBM-managed drivers."""
from typing import Optional

import pulumi
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import Resource

from ..common.versions import version_at_least
from ..common.waiting import WaitTimeout, wait_for
from .provider import CheckFailed, _Provider, _timing


class _NodeFenceProvider(_Provider):
    rerun_on = ("node", "labels", "operator_min_version", "stage")

    def run(self, api, p):
        """Label the node so the GPU Operator skips it while its kubelet predates `operator_min_version`.

        For an `ibm-managed` node (stage given) the node must exist and still run IBM's drivers: a worker already
        replaced at >= operator_min_version has no IBM drivers, and fencing it would take its GPUs away."""
        core, node, ibm_managed = client.CoreV1Api(api), p["node"], p.get("stage") == "ibm-managed"
        try:
            info = core.read_node(node).status.node_info
        except ApiException as e:
            if e.status == 404:
                if ibm_managed:
                    raise CheckFailed(f"node {node} (stage ibm-managed in gpu-migration:nodes) matches no node in "
                                      "the cluster; fix its name (`kubectl get nodes`)") from None
                return {"fenced": False}  # already replaced under another name
            raise
        kubelet = info.kubelet_version if info else None
        if kubelet and version_at_least(kubelet, p["operator_min_version"]):
            if ibm_managed:
                raise CheckFailed(
                    f"node {node} is set to stage ibm-managed but runs kubelet {kubelet}: its worker was already "
                    f"replaced and has no IBM-managed drivers; going back to ibm-managed is not supported. Set its "
                    f"stage to device-plugin (or dra)")
            return {"fenced": False}
        pulumi.log.info(f"node {node} runs kubelet {kubelet} (IBM-managed drivers): fencing it off the GPU Operator "
                        f"until its worker is replaced")
        core.patch_node(node, {"metadata": {"labels": p["labels"]}})
        return {"fenced": True}


class NodeFence(Resource, module="gpu-migration", name="NodeFence"):
    """Before the GPU Operator is installed: fence a node whose worker is not replaced yet (the replacement is a new
    Node object without these labels, so nothing has to remove them)."""

    fenced: pulumi.Output[bool]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        node: pulumi.Input[str],
        labels: pulumi.Input[dict],
        operator_min_version: pulumi.Input[str],
        stage: Optional[str] = None,  # "ibm-managed": the node must exist and still run IBM's drivers
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, node=node, labels=labels, operator_min_version=operator_min_version,
                     stage=stage, fenced=None)
        super().__init__(_NodeFenceProvider(), name, props, opts)


def unfenced(nodes: list[client.V1Node], labels: dict[str, str], operator_min_version: str) -> list[str]:
    """GPU nodes that still run IBM's drivers (kubelet below `operator_min_version`, where IKS installs them) without
    every fence label: the GPU Operator would run next to IBM's drivers there. Named with their worker pool."""
    from .inventory import IKS_POOL_LABEL, is_gpu_node
    out = []
    for n in nodes:
        info = n.status.node_info if n.status else None
        kubelet = info.kubelet_version if info else None
        node_labels = n.metadata.labels or {}
        if (is_gpu_node(n) and not version_at_least(kubelet, operator_min_version)
                and any(node_labels.get(k) != v for k, v in labels.items())):
            out.append(f"{n.metadata.name} (worker pool {node_labels.get(IKS_POOL_LABEL) or '?'}, kubelet {kubelet})")
    return sorted(out)


class _ClusterFencedProvider(_Provider):
    """With the fleet split over several stacks (gpu-migration:workerPools), the stack that installs the GPU Operator
    fences only its own nodes; the others fence theirs in their own `up`. So before the operator goes in, every GPU
    node of the whole cluster that still runs IBM's drivers must carry the fence, whichever stack set it. Waits,
    bounded by timeouts.operatorReady, so the stacks' `up`s may start in any order."""
    rerun_on = ("labels", "operator_min_version")

    def run(self, api, p):
        core = client.CoreV1Api(api)

        def check() -> list[str]:
            return unfenced(core.list_node().items, p["labels"], p["operator_min_version"])

        def poll():
            left = check()
            return not left, left, f"{len(left)} GPU node(s) on IBM's drivers not fenced yet: {', '.join(left[:10])}"

        try:
            wait_for("every GPU node on IBM's drivers to be fenced before the GPU Operator is installed", poll,
                     **_timing(p, 1800))
        except WaitTimeout as e:
            raise CheckFailed(
                f"{e}\nthe GPU Operator was not installed. Run `pulumi up` of the stacks whose "
                f"gpu-migration:workerPools hold these nodes (each fences its nodes first), or list a node in one "
                f"of them") from None
        pulumi.log.info("every GPU node on IBM's drivers is fenced, in every worker pool")
        return {"fenced_everywhere": True}


class ClusterFenced(Resource, module="gpu-migration", name="ClusterFenced"):
    """Before the GPU Operator, when several stacks share the cluster: every GPU node on IBM's drivers is fenced."""

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], labels: dict[str, str],
                 operator_min_version: str, timeout: pulumi.Input[float], poll_interval: pulumi.Input[float],
                 opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(_ClusterFencedProvider(), name, dict(
            kubeconfig=kubeconfig, labels=labels, operator_min_version=operator_min_version, timeout=timeout,
            poll_interval=poll_interval, fenced_everywhere=None), opts)
