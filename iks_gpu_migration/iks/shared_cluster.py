"""SharedClusterReady: in a stack that leaves the cluster-wide parts to another (gpu-migration:clusterComponents:
false), nothing of its nodes goes out before those parts are in.

The stack with clusterComponents (one per cluster) updates the master and installs the GPU Operator once every GPU
node on IBM's drivers is fenced (kube/fence.py ClusterFenced). This stack's replacements need both: IKS creates a
worker at most at the master's version (IBM Cloud docs "Updating clusters, worker nodes, and cluster components": the
master first), and a new worker without the operator gets no driver. So its first gate waits, read-only, until the
master runs the target version and rests (three readings in a row, as MasterVersion waits:
terraform-provider-ibm waitForVpcClusterMasterAvailable) and the operator's pod runs (the chart's Deployment
`gpu-operator`, pod label app=gpu-operator: NVIDIA/gpu-operator deployments/gpu-operator/templates/operator.yaml).
"""
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from ..common.waiting import WaitTimeout, wait_for
from ..plan import iks_rules
from .master import describe_master, master_rests
from .provider import ReplacementError, Streak, _IksProvider, _public, major_minor

OPERATOR_POD_SELECTOR = "app=gpu-operator"


def operator_running(api, namespace: str) -> tuple[bool, str]:
    from kubernetes import client
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=OPERATOR_POD_SELECTOR).items
    ready = [p.metadata.name for p in pods if p.status and p.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
    if ready:
        return True, f"GPU Operator pod {ready[0]} ready in {namespace}"
    return False, (f"no ready GPU Operator pod ({OPERATOR_POD_SELECTOR}) in namespace {namespace} "
                   f"({len(pods)} pod(s) found)")


class SharedClusterReadyProvider(_IksProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        return dyn.CreateResult(f"shared-cluster-{props['cluster']}", {**_public(props), **self._wait(props)})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        replaces = [k for k in ("cluster", "version", "namespace") if olds.get(k) != news.get(k)]
        return dyn.DiffResult(changes=bool(replaces) or olds.get("timeout") != news.get("timeout"), replaces=replaces)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        return dyn.UpdateResult({**_public(olds), **_public(news)})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        pass  # a wait leaves nothing behind

    def _wait(self, props: dict[str, Any]) -> dict[str, Any]:
        from ..kube.clients import api_client  # kubernetes is only needed here and when draining
        cluster, target = props["cluster"], iks_rules.master_version(props["version"])
        iks, streak = self.client(props), Streak(self.readings(props))
        timeout, interval = self.timing(props, 3600)
        with api_client(props.get("kubeconfig")) as api:
            def poll():
                info = iks.get_cluster(cluster)
                at_target = (major_minor(info.get("masterKubeVersion")) == major_minor(target)
                             and master_rests(info))
                master_ok = streak.see("master", at_target)
                operator_ok, operator = operator_running(api, props["namespace"])
                state = (f"{describe_master(info)}, {streak.of('master')}; {operator}")
                return master_ok and operator_ok, state, state

            try:
                state = wait_for(f"the cluster-wide parts of {cluster} (the stack with "
                                 f"gpu-migration:clusterComponents: true updates the master to {target} and "
                                 f"installs the GPU Operator)", poll, timeout, interval)
            except WaitTimeout as e:
                raise ReplacementError(
                    f"{e}\nnone of this stack's nodes was changed. Run `pulumi up` of the stack with "
                    f"gpu-migration:clusterComponents: true (it updates the master and installs the GPU Operator "
                    f"once every stack fenced its nodes on IBM's drivers), then this one again") from None
        pulumi.log.info(f"cluster {cluster}: {state}")
        return {"ready": state}


class SharedClusterReady(dyn.Resource, module="gpu-migration", name="SharedClusterReady"):
    """Before this stack's first batch: the master at `version` and the GPU Operator running, both the work of the
    stack with clusterComponents."""

    def __init__(self, name: str, cluster: str, version: str, api: dict[str, Any],
                 kubeconfig: pulumi.Input[Optional[str]], namespace: str, timeout: float, poll_interval: float,
                 opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(SharedClusterReadyProvider(), name, dict(
            cluster=cluster, version=version, api=api, kubeconfig=kubeconfig, namespace=namespace, timeout=timeout,
            poll_interval=poll_interval, ready=None), opts)
