"""GpuOperator: the NVIDIA GPU Operator's Helm release, installed only once every node that keeps IBM's drivers is
fenced (never next to IBM's drivers), and the runbook's check that none of its operands runs on such a node."""
from typing import Sequence

import pulumi

from ..config import OPERATOR_MIN_VERSION, MigrationConfig
from ..kube.fence import ClusterFenced
from ..kube.labels import IBM_MANAGED_LABELS
from ..kube.operands import OperandPlacement
from ..state_compat import WAS_AT_ROOT
from . import charts
from .gpu_node import Context, GpuNode


class GpuOperator(pulumi.ComponentResource):
    """`release` after every fence; `placement` checks that no operand pod runs on a node that keeps IBM's drivers."""

    def __init__(self, cfg: MigrationConfig, ctx: Context, gpu_nodes: Sequence[GpuNode],
                 inventory: pulumi.Resource):
        super().__init__("gpu-migration:index:GpuOperator", "operator")
        fences = [r for n in gpu_nodes for r in (n.fence, n.labels) if r is not None]
        if cfg.worker_pools:  # other stacks fence the nodes of the other pools: all of them first
            fences.append(ClusterFenced(
                "cluster-fenced", kubeconfig=cfg.kubeconfig, labels=IBM_MANAGED_LABELS,
                operator_min_version=OPERATOR_MIN_VERSION, timeout=cfg.timeouts.operator_ready,
                poll_interval=cfg.timeouts.poll_interval,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*fences, inventory])))
        self.release = charts.gpu_operator_release(cfg.gpu_operator, opts=pulumi.ResourceOptions(
            parent=self, provider=ctx.chart_provider, depends_on=[*fences, inventory], aliases=WAS_AT_ROOT),
            timeout=cfg.timeouts.helm)
        self.placement = OperandPlacement(
            "operand-placement", kubeconfig=cfg.kubeconfig, namespace=cfg.gpu_operator.namespace,
            operator_min_version=OPERATOR_MIN_VERSION,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.release], aliases=WAS_AT_ROOT),
        )
        self.register_outputs({})
