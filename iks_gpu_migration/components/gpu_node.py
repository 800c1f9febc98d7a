"""GpuNode: one GPU node's resources for its configured stage, its children shown under it in `pulumi preview`.

Per node: fence -> [beforeReplace hook] -> worker replacement (drain, then replaceWorker) -> path switch, in one
resource with the [rollback check], operator readiness, operand placement and pending GPU pods; on `dra` also the
smoke pod and its verification (declared by the DRA path once the batch's preflight exists); [afterVerification hook]
last.
"""
from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from ..config import OPERATOR_MIN_VERSION, MigrationConfig, Node
from ..iks.replacement import WorkerReplacement
from ..kube import labels as node_labels
from ..kube.fence import NodeFence
from ..kube.smoke import SmokeTestVerification
from ..kube.switch import NodePathSwitch, Readiness, RollbackCheck
from . import hooks, smoke_pod


@dataclass
class Context:
    """What every node's resources share: the cluster's Kubernetes provider and the IKS API settings. The Helm
    releases have a provider of their own (`chart_provider`: gpu-migration:chartKubeconfig, else the cluster's)."""
    k8s_provider: Optional[k8s.Provider]
    ibm_api: dict[str, Any]
    chart_provider: Optional[k8s.Provider] = None


class GpuNode(pulumi.ComponentResource):
    """Everything one GPU node needs for its configured stage; children appear under it in `pulumi preview`."""

    def __init__(self, node: Node, cfg: MigrationConfig, ctx: Context, inventory: pulumi.Resource):
        super().__init__("gpu-migration:index:GpuNode", node.ident, {"stage": node.stage})
        self.node, self.cfg, self.ctx = node, cfg, ctx
        self.hostname: pulumi.Input[str] = node.name
        self.fence = self.replacement = None
        self.switch = self.labels = None
        self.smoke_pod = self.verification = None
        self.before_hook = self.after_hook = None
        # What the next batch waits for (rollout.when_done): the path switch (ending with readiness) and, on dra, the
        # smoke verification, which uncordons the node: the next gate counts a node still cordoned as unavailable.
        self.done_by: list[pulumi.Resource] = []
        # No node is touched, not even fenced, before the inventory found every GPU node listed: nothing half-applied.
        # ibm-managed: the fence refuses a node already replaced (no IBM drivers) or missing, then sets both runbook
        # labels once; the NodePatch keeps only deploy.operands=false (kube/labels.py). Other stages: until its
        # worker is replaced the node still runs IBM's drivers, so the GPU Operator is kept off it (the replacement
        # is a new Node object without these labels, so nothing has to remove them).
        ibm_managed = node.stage == "ibm-managed"
        self.fence = NodeFence(
            f"{node.ident}-fence",
            kubeconfig=cfg.kubeconfig,
            node=node.name,
            labels=node_labels.IBM_MANAGED_LABELS,
            operator_min_version=OPERATOR_MIN_VERSION,
            **({"stage": "ibm-managed"} if ibm_managed else {}),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[inventory]),
        )
        if ibm_managed:
            self.labels = self._labels([self.fence])

    def _labels(self, deps: list[pulumi.Resource]) -> k8s.core.v1.NodePatch:
        return node_labels.node_patch(
            f"{self.node.ident}-labels",
            self.hostname,
            node_labels.stage_labels(self.node.stage, self.cfg.pilot_label_pair),
            opts=pulumi.ResourceOptions(parent=self, provider=self.ctx.k8s_provider, depends_on=deps),
        )

    def migrate(self, after: list[pulumi.Resource], operator_namespace: pulumi.Input[str],
                evict: Optional[dict[str, Any]] = None) -> None:
        """Replace the worker (after `after`), switch it to its stage's path, verify a rollback, check readiness."""
        self.before_hook = hooks.node_hook(
            "before-replace", self.cfg.hooks.before_replace, self.node, self.node.name, self.node.worker_id,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, self.fence]),
        )
        self._replace(after, evict)
        self._switch(operator_namespace)
        self.done_by = [self.switch]

    def _replace(self, after: list[pulumi.Resource], evict: Optional[dict[str, Any]]) -> None:
        """A worker replaced at the target version (idempotent once done); its node name can change."""
        node, cfg, t = self.node, self.cfg, self.cfg.timeouts
        self.replacement = WorkerReplacement(
            f"{node.ident}-replacement",
            cluster=cfg.cluster_name,
            worker_id=node.worker_id,
            node_name=node.name,
            kube_version=cfg.kube_version,
            api=self.ctx.ibm_api,
            timeout=t.worker_replace,
            poll_interval=t.poll_interval,
            # The only GPU node is replaced only with a temporary GPU pool to take its workloads.
            single_gpu_node=len(cfg.nodes) == 1 and not cfg.temp_gpu_pool.enabled,
            # Before each replaceWorker (also on a kubeVersion bump) the node is cordoned and its pods evicted.
            evict=evict,
            # Pools that may be replaced although rebalancing is off or the autoscaler manages them (iks/pool_rules.py).
            pool_rules=cfg.worker_pool_rules.props() or None,
            opts=pulumi.ResourceOptions(parent=self,
                                        depends_on=[*after, *filter(None, [self.fence, self.before_hook])]),
        )
        self.hostname = self.replacement.node_name
        self.hostname.apply(lambda actual: _warn_renamed(node, actual))

    def _switch(self, operator_namespace: pulumi.Input[str]) -> None:
        """Device plugin <-> DRA, step by step (never both paths at once); a no-op when the node is already there.
        Back on the device plugin, a check pod proves the plugin serves the node's GPU. Then the node's readiness:
        operand pods up and GPUs offered on its path; operands start asynchronously after the install, so their
        placement is checked again; then the GPU pods still Pending (the runbook expects Pending GPU workloads to run
        once the node's driver is in). One resource (kube/switch.py); the next batch waits for it."""
        node, cfg, t = self.node, self.cfg, self.cfg.timeouts
        check = RollbackCheck(image=cfg.smoke_test.image, namespace=cfg.smoke_test.namespace, timeout=t.smoke_test,
                              tolerations=tuple(cfg.tolerations)) if node.stage == "device-plugin" else None
        readiness = Readiness(
            operator_namespace=operator_namespace,  # resolves once the operator, its placement check, DRA driver are in
            timeout=t.operator_ready,
            operator_min_version=OPERATOR_MIN_VERSION,
            gpu_resources=sorted({cfg.device_plugin_resource, cfg.extended_resource_name}),
            pending_gate=cfg.pending_gpu_pods_gate,
            dra_namespace=cfg.dra_driver.namespace if node.stage == "dra" else None,
            config_name=node.name,
        )
        self.switch = NodePathSwitch(
            f"{node.ident}-switch",
            kubeconfig=cfg.kubeconfig,
            node=self.hostname,
            target=node.stage,
            pilot_label=cfg.pilot_label,
            device_plugin_resource=cfg.device_plugin_resource,
            extended_resource=cfg.extended_resource_name,
            driver=cfg.dra_driver_name,
            drain_timeout=t.drain,
            switch_timeout=t.path_switch,
            poll_interval=t.poll_interval,
            rollback_check=check,
            readiness=readiness,
            # Only when chosen: a stack that keeps waiting stores no new input on its switches.
            evict_with=cfg.drain.model_dump(exclude_defaults=True) if cfg.drain.switch_gpu_pods == "evict" else None,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.replacement, *filter(None, [self.before_hook])]),
        )

    def declare_smoke_test(self, cfg: MigrationConfig, ctx: Context, deps: list[pulumi.Resource]) -> None:
        self.smoke_pod = smoke_pod.smoke_pod(
            self.node.ident,
            self.hostname,
            cfg.smoke_test,
            cfg.extended_resource_name,
            cfg.pilot_label_pair,
            tolerations=cfg.tolerations,
            opts=pulumi.ResourceOptions(parent=self, provider=ctx.k8s_provider, depends_on=deps),
        )
        t = cfg.timeouts
        self.verification = SmokeTestVerification(
            f"{self.node.ident}-smoke-verification",
            kubeconfig=cfg.kubeconfig,
            namespace=cfg.smoke_test.namespace,
            pod_name=self.smoke_pod.metadata.name,
            pod_uid=self.smoke_pod.metadata.uid,
            node=self.hostname,
            driver=cfg.dra_driver_name,
            extended_resource=cfg.extended_resource_name,
            dra_namespace=cfg.dra_driver.namespace,
            timeout=t.smoke_test,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.smoke_pod]),
        )
        self.done_by.append(self.verification)

    def declare_after_hook(self) -> None:
        """After everything that verifies this node: its path switch (with the rollback check, readiness, operand
        placement and pending GPU pods) and smoke verification."""
        checks = [r for r in (self.switch, self.verification) if r is not None]
        self.after_hook = hooks.node_hook(
            "after-verification", self.cfg.hooks.after_verification, self.node, self.hostname,
            self.replacement.new_worker_id, opts=pulumi.ResourceOptions(parent=self, depends_on=checks),
        )


def _warn_renamed(node: Node, actual: Optional[str]) -> None:
    """The new node is recorded in state (output node:<key>.nodeName); later runs use it, so nothing must change."""
    if actual and actual != node.name:
        pulumi.log.info(  # once, as it happens: the new name is in the outputs the CLI prints last
            f"node {node.name!r} (worker {node.worker_id}) was replaced; its node is now {actual!r}, recorded in the "
            f"stack state (`pulumi stack output`). Nothing to change in gpu-migration:nodes; to show the new name "
            f"there, set name: {actual!r} and key: {node.ident!r} so its resources keep their identity",
            ephemeral=True,
        )
