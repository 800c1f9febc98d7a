"""ClusterIdentity: the kubeconfig's cluster is the IKS cluster `clusterName` names, checked on every `up` before
anything changes (every other resource waits for it through the GPU node inventory).

Nothing else ties the two: the program sends Kubernetes changes through the kubeconfig and IKS changes to
`clusterName`, so a kubeconfig of another cluster would fence, drain and label that cluster's nodes while IKS
replaces this one's workers. IKS labels every worker's node with its worker ID (ibm-cloud.kubernetes.io/worker-id,
read back by IBM-Cloud/cloud-provider-ibm ibm/ibm_metadata_service.go), so the GPU nodes' IDs must be among
getWorkers(clusterName); with no GPU node carrying one (every GPU worker mid-replacement), the other workers' nodes.
First of all, the cluster must be IKS on VPC Gen 2 (not classic infrastructure, not Red Hat OpenShift):
plan/iks_rules.py cluster_kind_refusal.
"""
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from ..kube.inventory import IKS_WORKER_ID_LABEL, is_gpu_node
from ..plan.iks_rules import cluster_kind_refusal
from .provider import _IksProvider, _public

SHOWN = 3  # mismatching nodes named in the error


class ClusterMismatch(RuntimeError):
    """The kubeconfig points at another cluster than clusterName (or at no IKS cluster)."""


def mismatch(nodes: list[tuple[str, str, bool]], workers: set[str], cluster: str, target: str) -> Optional[str]:
    """None if the cluster's nodes are workers of IKS cluster `cluster`, else why not.

    `nodes`: (name, IKS worker ID label or "", is a GPU node) of every node; `workers`: the worker IDs IKS lists for
    `cluster` (deleted ones too: a deleted worker's node may linger); `target`: the kubeconfig's context and server."""
    labelled = [(name, wid) for name, wid, gpu in nodes if wid and gpu] or [(n, w) for n, w, _ in nodes if w]
    fix = (f"point gpu-migration:kubeconfig (or KUBECONFIG) at the kubeconfig of {cluster} (`ibmcloud ks cluster "
           f"config --cluster {cluster}`), or fix gpu-migration:clusterName. Nothing was changed")
    if not labelled:
        return (f"the kubeconfig's cluster ({target}) has no node labelled {IKS_WORKER_ID_LABEL}, so it can't be "
                f"tied to IKS cluster {cluster} (gpu-migration:clusterName): is it an IKS cluster? {fix}")
    foreign = [(name, wid) for name, wid in labelled if wid not in workers]
    if not foreign:
        return None
    named = ", ".join(f"node {name} (worker {wid})" for name, wid in foreign[:SHOWN])
    more = f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else ""
    verb = "is" if len(foreign) == 1 else "are"
    return (f"the kubeconfig's cluster ({target}) is not IKS cluster {cluster} (gpu-migration:clusterName): {named}"
            f"{more} {verb} not among the {len(workers)} workers IKS lists for {cluster}; {fix}")


def kubeconfig_target(kubeconfig: Optional[str], host: str) -> str:
    """`context <name>, server <url>` of the kubeconfig the checks use."""
    from kubernetes import config
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig or None)
        context = (active or {}).get("name") or "?"
    except Exception:  # noqa: BLE001 - the server alone still says where it points
        context = "?"
    return f"context {context}, server {host}"


class ClusterIdentityProvider(_IksProvider):
    """Runs on create and on every update (every `up`): a kubeconfig or clusterName change between runs counts."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        return dyn.CreateResult(f"cluster-identity-{props['cluster']}", self._check(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        return dyn.DiffResult(changes=True, replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        return dyn.UpdateResult(self._check(news))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        pass  # a check leaves nothing behind

    def _check(self, props: dict[str, Any]) -> dict[str, Any]:
        from kubernetes import client  # the IKS side needs kubernetes only here and when draining
        from ..kube.clients import api_client
        cluster, kubeconfig = props["cluster"], props.get("kubeconfig")
        with api_client(kubeconfig) as api:
            nodes = [(n.metadata.name, (n.metadata.labels or {}).get(IKS_WORKER_ID_LABEL, ""), is_gpu_node(n))
                     for n in client.CoreV1Api(api).list_node().items]
            target = kubeconfig_target(kubeconfig, api.configuration.host)
        iks = self.client(props)
        refusal = cluster_kind_refusal(cluster, iks.get_cluster(cluster))  # classic, OpenShift: before anything
        if refusal:
            raise ClusterMismatch(refusal)
        # Workers after nodes: a worker that joined in between is listed by IKS before its node registers.
        workers = {w["id"] for w in iks.list_workers(cluster, show_deleted=True)}
        problem = mismatch(nodes, workers, cluster, target)
        if problem:
            raise ClusterMismatch(problem)
        pulumi.log.info(f"the kubeconfig's cluster ({target}) is IKS cluster {cluster}")
        return {**_public(props), "nodes_checked": len(nodes)}


class ClusterIdentity(dyn.Resource, module="gpu-migration", name="ClusterIdentity"):
    """The kubeconfig's cluster is IKS cluster `cluster`: its nodes' worker IDs are among getWorkers(cluster)."""

    nodes_checked: pulumi.Output[int]

    def __init__(self, name: str, cluster: pulumi.Input[str], kubeconfig: pulumi.Input[Optional[str]],
                 api: pulumi.Input[dict], opts: Optional[pulumi.ResourceOptions] = None) -> None:
        props = {"cluster": cluster, "kubeconfig": kubeconfig, "api": api, "nodes_checked": None}
        super().__init__(ClusterIdentityProvider(), name, props, opts)
