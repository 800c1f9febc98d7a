"""NodeFence: keeps the GPU Operator off a node that still runs IBM-managed drivers."""
from typing import Optional

import pulumi
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import Resource

from ..common.versions import version_at_least
from .provider import CheckFailed, _Provider


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
