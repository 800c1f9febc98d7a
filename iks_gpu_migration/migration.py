"""Declares the whole migration for one stack from its validated config.

Order of operations (enforced with depends_on):
  master version -> [temporary GPU pool] -> for each node past `ibm-managed`, one at a time:
  fence -> worker replacement -> labels -> operator readiness -> next node.
  `ibm-managed` labels + fences of nodes awaiting replacement -> GPU Operator (never next to IBM's drivers).
  `dra` labels + DRA driver + DeviceClass -> preflight -> smoke Pods -> smoke verification.
  Rollback (`dra` -> `device-plugin`): drain -> labels -> verification on the device-plugin path.
"""
from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from . import charts, dra, iks_providers, kube_providers, node_labels, smoke_test
from .config import MIN_MINOR, MigrationConfig, Node

OPERATOR_MIN_VERSION = f"1.{MIN_MINOR['device-plugin']}"  # workers below it still run IBM-managed drivers


@dataclass
class Declared:
    """Handles on what was declared, for stack outputs and tests."""
    master: Any = None
    temp_pool: Any = None
    gpu_operator: Any = None
    dra_driver: Any = None
    device_class: Any = None
    preflight: Any = None
    nodes: dict[str, "GpuNode"] = field(default_factory=dict)


class GpuNode(pulumi.ComponentResource):
    """Everything one GPU node needs for its configured stage; children appear under it in `pulumi preview`."""

    def __init__(self, node: Node, cfg: MigrationConfig, ctx: "Context"):
        super().__init__("gpu-migration:index:GpuNode", node.ident, {"stage": node.stage})
        self.node, self.cfg, self.ctx = node, cfg, ctx
        self.hostname: pulumi.Input[str] = node.name
        self.fence = self.replacement = self.drain = self.rollback = self.readiness = None
        self.smoke_pod = self.verification = None
        if node.stage == "ibm-managed":
            self.labels = self._labels([])
        else:
            # Until its worker is replaced the node still runs IBM's drivers: keep the GPU Operator off it.
            # (The replacement is a new Node object without these labels, so nothing has to remove them.)
            self.fence = kube_providers.NodeFence(
                f"{node.ident}-fence",
                kubeconfig=cfg.kubeconfig,
                node=node.name,
                labels=node_labels.IBM_MANAGED_LABELS,
                operator_min_version=OPERATOR_MIN_VERSION,
                opts=pulumi.ResourceOptions(parent=self),
            )

    def _labels(self, deps: list[pulumi.Resource]) -> k8s.core.v1.NodePatch:
        return node_labels.node_patch(
            f"{self.node.ident}-labels",
            self.hostname,
            node_labels.stage_labels(self.node.stage, self.cfg.pilot_label_pair),
            opts=pulumi.ResourceOptions(parent=self, provider=self.ctx.k8s_provider, depends_on=deps),
        )

    def migrate(
        self,
        after: list[pulumi.Resource],
        readiness_deps: list[pulumi.Resource],
        other_worker_ids: list[pulumi.Input[str]],
        evict: Optional[dict[str, Any]] = None,
    ) -> None:
        """Replace the worker (after `after`), label it for its stage, roll back from dra if needed, check readiness."""
        node, cfg, ctx, t = self.node, self.cfg, self.ctx, self.cfg.timeouts
        # A worker replaced at the target version (idempotent once done); its node name can change.
        self.replacement = iks_providers.WorkerReplacement(
            f"{node.ident}-replacement",
            cluster=cfg.cluster_name,
            worker_id=node.worker_id,
            node_name=node.name,
            kube_version=cfg.kube_version,
            api=ctx.ibm_api,
            timeout=t.worker_replace,
            poll_interval=t.poll_interval,
            other_worker_ids=other_worker_ids,  # lets a resumed replacement tell its new worker from siblings
            # The only GPU node is replaced only with a temporary GPU pool to take its workloads.
            single_gpu_node=len(cfg.nodes) == 1 and not cfg.temp_gpu_pool.enabled,
            # Before each replaceWorker (also on a kubeVersion bump) the node is cordoned and its pods evicted.
            evict=evict,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, self.fence]),
        )
        self.hostname = self.replacement.node_name
        self.hostname.apply(lambda actual: _warn_renamed(node, actual))

        label_deps: list[pulumi.Resource] = [self.replacement]
        if node.stage == "device-plugin":
            # Rollback from dra: cordon and let GPU pods finish before the labels switch (no-op otherwise).
            self.drain = kube_providers.NodeDrain(
                f"{node.ident}-drain",
                kubeconfig=cfg.kubeconfig,
                node=self.hostname,
                pilot_label=cfg.pilot_label,
                extended_resource=cfg.extended_resource_name,
                timeout=t.drain,
                poll_interval=t.poll_interval,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.replacement]),
            )
            label_deps.append(self.drain)
        self.labels = self._labels(label_deps)

        if self.drain is not None:
            self.rollback = kube_providers.RollbackVerification(
                f"{node.ident}-rollback",
                kubeconfig=cfg.kubeconfig,
                node=self.hostname,
                rolling_back=self.drain.rolling_back,
                extended_resource=cfg.device_plugin_resource,  # the check pod must get its GPU from the plugin
                image=cfg.smoke_test.image,
                namespace=cfg.smoke_test.namespace,
                timeout=t.smoke_test,
                poll_interval=t.poll_interval,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.labels]),
            )

        # Operand pods up and GPUs allocatable on the replaced node; the next node waits for this.
        self.readiness = kube_providers.OperatorReadiness(
            f"{node.ident}-operator-ready",
            kubeconfig=cfg.kubeconfig,
            node=self.hostname,
            stage=node.stage,
            namespace=cfg.gpu_operator.namespace,
            driver=cfg.dra_driver_name,
            device_plugin_resource=cfg.device_plugin_resource,
            timeout=t.operator_ready,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.labels, *readiness_deps, *filter(None, [self.replacement, self.rollback])]
            ),
        )

    def declare_smoke_test(self, cfg: MigrationConfig, ctx: "Context", deps: list[pulumi.Resource]) -> None:
        self.smoke_pod = smoke_test.smoke_pod(
            self.node.ident,
            self.hostname,
            cfg.smoke_test,
            cfg.extended_resource_name,
            cfg.pilot_label_pair,
            opts=pulumi.ResourceOptions(parent=self, provider=ctx.k8s_provider, depends_on=deps),
        )
        t = cfg.timeouts
        self.verification = kube_providers.SmokeTestVerification(
            f"{self.node.ident}-smoke-verification",
            kubeconfig=cfg.kubeconfig,
            namespace=cfg.smoke_test.namespace,
            pod_name=self.smoke_pod.metadata.name,
            pod_uid=self.smoke_pod.metadata.uid,
            node=self.hostname,
            driver=cfg.dra_driver_name,
            extended_resource=cfg.extended_resource_name,
            timeout=t.smoke_test,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.smoke_pod]),
        )


def _warn_renamed(node: Node, actual: Optional[str]) -> None:
    """The new node is recorded in state (output node:<key>.nodeName); later runs use it, so nothing must change."""
    if actual and actual != node.name:
        pulumi.log.info(
            f"node {node.name!r} (worker {node.worker_id}) was replaced; its node is now {actual!r}, recorded in the "
            f"stack state (`pulumi stack output`). Nothing to change in gpu-migration:nodes; to show the new name "
            f"there, set name: {actual!r} and key: {node.ident!r} so its resources keep their identity"
        )


@dataclass
class Context:
    k8s_provider: Optional[k8s.Provider]
    ibm_api: dict[str, Any]


def ibm_api(cfg: MigrationConfig) -> dict[str, Any]:
    """IKS endpoints and the IAM API key (secret config `gpu-migration:ibmApiKey`, else IC_API_KEY in the provider)."""
    return {
        "endpoint": cfg.ibm_cloud.endpoint,
        "iam_endpoint": cfg.ibm_cloud.iam_endpoint,
        "api_key": pulumi.Config("gpu-migration").get_secret("ibmApiKey"),
    }


def eviction_settings(cfg: MigrationConfig, temp_pool: Any) -> dict[str, Any]:
    """node_eviction settings for every WorkerReplacement: with a temporary pool, its nodes must offer GPUs first."""
    resources = list(dict.fromkeys([cfg.device_plugin_resource, "nvidia.com/gpu"]))
    return {
        "kubeconfig": cfg.kubeconfig,
        "timeout": cfg.timeouts.evict,
        "poll_interval": cfg.timeouts.poll_interval,
        "gpu_nodes": temp_pool.node_names if temp_pool is not None else [],
        "gpu_resources": resources,
    }


def declare(cfg: MigrationConfig) -> Declared:
    out = Declared()
    provider = k8s.Provider("cluster", kubeconfig=cfg.kubeconfig) if cfg.kubeconfig else None
    ctx = Context(k8s_provider=provider, ibm_api=ibm_api(cfg))
    k8s_opts = pulumi.ResourceOptions(provider=provider)
    t = cfg.timeouts

    # The master must be at the target version before any worker is replaced.
    out.master = iks_providers.MasterVersion(
        "master-version",
        cluster=cfg.cluster_name,
        version=cfg.kube_version,
        api=ctx.ibm_api,
        timeout=t.master_update,
        poll_interval=t.poll_interval,
    )
    after: list[pulumi.Resource] = [out.master]
    pool = cfg.temp_gpu_pool
    if pool.enabled:
        out.temp_pool = iks_providers.TempGpuPool(
            "temp-gpu-pool",
            cluster=cfg.cluster_name,
            pool_name=pool.name,
            flavor=pool.flavor,
            zone=pool.zone,
            vpc_id=pool.vpc_id,
            subnet_id=pool.subnet_id,
            size_per_zone=pool.size_per_zone,
            api=ctx.ibm_api,
            timeout=t.worker_pool,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(depends_on=[out.master]),
        )
        after.append(out.temp_pool)

    # The GPU Operator arrives only once every node still on IBM's drivers is fenced off: ibm-managed nodes by their
    # labels, nodes awaiting replacement by their NodeFence.
    gpu_nodes = [GpuNode(n, cfg, ctx) for n in cfg.nodes]
    fenced = pulumi.ResourceOptions(depends_on=[n.labels if n.fence is None else n.fence for n in gpu_nodes])
    out.gpu_operator = charts.gpu_operator_release(cfg.gpu_operator, opts=pulumi.ResourceOptions.merge(k8s_opts, fenced))
    readiness_deps: list[pulumi.Resource] = [out.gpu_operator]
    if cfg.nodes_in("dra"):
        # Kept while any node is dra; removed (after all updates) once none is.
        out.dra_driver = charts.dra_driver_release(cfg.dra_driver, cfg.pilot_label_pair, opts=k8s_opts)
        out.device_class = dra.device_class(
            cfg.extended_resource_name, cfg.dra_driver_name, cfg.device_selectors, opts=k8s_opts
        )
        readiness_deps.append(out.dra_driver)

    # Nodes past ibm-managed are replaced one at a time, in config order: each waits for the previous one's readiness.
    migrated = [n for n in gpu_nodes if n.node.stage != "ibm-managed"]
    evict = eviction_settings(cfg, out.temp_pool)
    if out.temp_pool is not None:
        after = [*after, out.gpu_operator]  # the temporary pool offers GPUs only once the operator runs there
    for i, gpu_node in enumerate(migrated):
        previous = [migrated[i - 1].readiness] if i else []
        siblings = [n.worker_id for n in cfg.nodes if n != gpu_node.node]
        siblings += [m.replacement.new_worker_id for m in migrated[:i]]
        gpu_node.migrate(after + previous, readiness_deps, siblings, evict)
    for gpu_node in gpu_nodes:
        gpu_node.register_outputs({"stage": gpu_node.node.stage})
    out.nodes = {n.node.ident: n for n in gpu_nodes}
    dra_nodes = [n for n in migrated if n.node.stage == "dra"]

    if dra_nodes:
        out.preflight = kube_providers.DraPreflight(
            "dra-preflight",
            kubeconfig=cfg.kubeconfig,
            driver=cfg.dra_driver_name,
            extended_resource=cfg.extended_resource_name,
            dra_nodes=[n.hostname for n in dra_nodes],
            all_nodes=[n.hostname for n in out.nodes.values()],
            device_plugin_resource=cfg.device_plugin_resource,
            timeout=t.operator_ready,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(
                depends_on=[out.dra_driver, out.device_class, *(n.labels for n in dra_nodes),
                            *(n.readiness for n in dra_nodes)]
            ),
        )
        namespace = smoke_test.smoke_namespace(cfg.smoke_test, opts=k8s_opts)
        for gpu_node in dra_nodes:
            gpu_node.declare_smoke_test(cfg, ctx, [out.preflight, namespace])
    return out


def export(out: Declared) -> None:
    """Per-node stage, worker and verification, read by operators and `pulumi stack output`."""
    for name, gpu_node in out.nodes.items():
        entry: dict[str, Any] = {"stage": gpu_node.node.stage, "workerId": gpu_node.node.worker_id,
                                 "configName": gpu_node.node.name, "nodeName": gpu_node.node.name}
        if gpu_node.replacement is not None:  # the worker and node as they are now (read by status)
            entry["replacedWorkerId"] = gpu_node.replacement.new_worker_id
            entry["nodeName"] = gpu_node.replacement.node_name
        if gpu_node.verification is not None:
            entry["smokeTest"] = gpu_node.verification.result
        pulumi.export(f"node:{name}", entry)
