"""Declares the whole migration for one stack from its validated config.

Order of operations (enforced with depends_on, and between batches by rollout.py):
  master version -> [temporary GPU pool] -> the plan's batches (plan.py: at most maxUnavailable + surge nodes at once),
  each after its CapacityGate and after the previous batch is done; per node:
  fence -> worker replacement -> labels -> operator readiness.
  `ibm-managed` labels + fences of nodes awaiting replacement -> GPU Operator (never next to IBM's drivers).
  `dra` labels + DRA driver + DeviceClass -> preflight -> smoke Pods -> smoke verification.
  Rollback (`dra` -> `device-plugin`): drain -> labels -> verification on the device-plugin path.
"""
from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from . import charts, dra, iks_providers, kube_providers, node_labels, rollout, smoke_test
from .config import MIN_MINOR, MigrationConfig, Node
from .plan import Plan, plan_for

OPERATOR_MIN_VERSION = f"1.{MIN_MINOR['device-plugin']}"  # workers below it still run IBM-managed drivers
# pulumi/dynamic/__main__.py: grpc.server(futures.ThreadPoolExecutor(max_workers=4)) serves every dynamic resource.
DYNAMIC_PROVIDER_WORKERS = 4


@dataclass
class Declared:
    """Handles on what was declared, for stack outputs and tests."""
    master: Any = None
    temp_pool: Any = None
    gpu_operator: Any = None
    dra_driver: Any = None
    device_class: Any = None
    preflight: Any = None
    plan: Optional[Plan] = None
    gates: list[Any] = field(default_factory=list)
    nodes: dict[str, "GpuNode"] = field(default_factory=dict)


class GpuNode(pulumi.ComponentResource):
    """Everything one GPU node needs for its configured stage; children appear under it in `pulumi preview`."""

    def __init__(self, node: Node, cfg: MigrationConfig, ctx: "Context"):
        super().__init__("gpu-migration:index:GpuNode", node.name, {"stage": node.stage})
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
                f"{node.name}-fence",
                kubeconfig=cfg.kubeconfig,
                node=node.name,
                labels=node_labels.IBM_MANAGED_LABELS,
                operator_min_version=OPERATOR_MIN_VERSION,
                opts=pulumi.ResourceOptions(parent=self),
            )

    def _labels(self, deps: list[pulumi.Resource]) -> k8s.core.v1.NodePatch:
        return node_labels.node_patch(
            f"{self.node.name}-labels",
            self.hostname,
            node_labels.stage_labels(self.node.stage, self.cfg.pilot_label_pair),
            opts=pulumi.ResourceOptions(parent=self, provider=self.ctx.k8s_provider, depends_on=deps),
        )

    def migrate(self, after: list[pulumi.Resource], readiness_deps: list[pulumi.Resource]) -> None:
        """Replace the worker (after `after`), label it for its stage, roll back from dra if needed, check readiness."""
        node, cfg, ctx, t = self.node, self.cfg, self.ctx, self.cfg.timeouts
        # A worker replaced at the target version (idempotent once done); its node name can change.
        self.replacement = iks_providers.WorkerReplacement(
            f"{node.name}-replacement",
            cluster=cfg.cluster_name,
            worker_id=node.worker_id,
            node_name=node.name,
            kube_version=cfg.kube_version,
            api=ctx.ibm_api,
            timeout=t.worker_replace,
            poll_interval=t.poll_interval,
            # The only GPU node is replaced only with a temporary GPU pool to take its workloads.
            single_gpu_node=len(cfg.nodes) == 1 and not cfg.temp_gpu_pool.enabled,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, self.fence]),
        )
        self.hostname = self.replacement.node_name
        self.hostname.apply(lambda actual: _warn_renamed(node, actual))

        label_deps: list[pulumi.Resource] = [self.replacement]
        if node.stage == "device-plugin":
            # Rollback from dra: cordon and let GPU pods finish before the labels switch (no-op otherwise).
            self.drain = kube_providers.NodeDrain(
                f"{node.name}-drain",
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
                f"{node.name}-rollback",
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

        # Operand pods up and GPUs allocatable on the replaced node; the next batch waits for this.
        self.readiness = kube_providers.OperatorReadiness(
            f"{node.name}-operator-ready",
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
            self.node.name,
            self.hostname,
            cfg.smoke_test,
            cfg.extended_resource_name,
            cfg.pilot_label_pair,
            opts=pulumi.ResourceOptions(parent=self, provider=ctx.k8s_provider, depends_on=deps),
        )
        t = cfg.timeouts
        self.verification = kube_providers.SmokeTestVerification(
            f"{self.node.name}-smoke-verification",
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
    if actual and actual != node.name:
        pulumi.log.warn(
            f"worker {node.worker_id} was replaced and its node is now {actual!r}, not {node.name!r}; "
            f"update name in gpu-migration:nodes to {actual!r}"
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

    # Nodes past ibm-managed migrate in the plan's batches, each batch after its capacity gate and the previous batch.
    out.plan = plan_for(cfg)
    if pulumi.runtime.is_dry_run():
        pulumi.log.info(out.plan.render())
    if out.plan.budget.batch_size > DYNAMIC_PROVIDER_WORKERS:
        pulumi.log.warn(
            f"batches of {out.plan.budget.batch_size} nodes: the Python dynamic-provider host runs at most "
            f"{DYNAMIC_PROVIDER_WORKERS} provider operations at once, so at most that many nodes of a batch progress "
            f"together (see README, Fleet scale)"
        )
    by_name = {n.node.name: n for n in gpu_nodes}
    out.gates = rollout.declare_batches(out.plan, by_name, cfg, after, readiness_deps)
    migrated = [n for n in gpu_nodes if n.node.stage != "ibm-managed"]
    for gpu_node in gpu_nodes:
        gpu_node.register_outputs({"stage": gpu_node.node.stage})
    out.nodes = {n.node.name: n for n in gpu_nodes}
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
        entry: dict[str, Any] = {"stage": gpu_node.node.stage, "workerId": gpu_node.node.worker_id}
        if gpu_node.replacement is not None:
            entry["replacedWorkerId"] = gpu_node.replacement.new_worker_id
            entry["nodeName"] = gpu_node.replacement.node_name
        if gpu_node.verification is not None:
            entry["smokeTest"] = gpu_node.verification.result
        pulumi.export(f"node:{name}", entry)
