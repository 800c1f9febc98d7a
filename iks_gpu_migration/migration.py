"""Declares the whole migration for one stack from its validated config.

Order of operations (enforced with depends_on, and between batches by rollout.py):
  GPU node inventory (every GPU node of the cluster listed) -> master version -> [temporary GPU pool] ->
  the plan's batches (plan.py: at most maxUnavailable + surge nodes at once), each after its CapacityGate, which is
  registered only once every node of the previous batch is done; per node of a batch:
  fence -> [beforeReplace hook] -> worker replacement (cordon + evict, then replaceWorker) -> path switch
  (node_switch) -> operator readiness -> operand placement -> pending GPU pods.
  Inventory + `ibm-managed` fences and labels + fences of nodes awaiting replacement -> GPU Operator (never next to
  IBM's drivers) -> operand placement check.
  Master -> DRA driver + DeviceClass; `dra` switches + readiness -> preflight -> smoke Pods -> smoke verification
  (which uncordons). Rollback (`dra` -> `device-plugin`): path switch -> verification on the device-plugin path.
  Optional hooks (config `hooks`): beforeReplace before a node's replacement and path switch (which drains),
  afterVerification after everything that verifies the node (switch, readiness, operand placement, pending GPU pods,
  rollback check, smoke verification on `dra`).
"""
from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from . import charts, dra, hooks, iks_providers, kube_providers, node_labels, node_switch, rollout, smoke_test
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
    inventory: Any = None
    operand_placement: Any = None
    plan: Optional[Plan] = None
    gates: list[Any] = field(default_factory=list)
    preflights: list[Any] = field(default_factory=list)  # one per batch with dra nodes
    nodes: dict[str, "GpuNode"] = field(default_factory=dict)


class GpuNode(pulumi.ComponentResource):
    """Everything one GPU node needs for its configured stage; children appear under it in `pulumi preview`."""

    def __init__(self, node: Node, cfg: MigrationConfig, ctx: "Context", inventory: pulumi.Resource):
        super().__init__("gpu-migration:index:GpuNode", node.ident, {"stage": node.stage})
        self.node, self.cfg, self.ctx = node, cfg, ctx
        self.hostname: pulumi.Input[str] = node.name
        self.fence = self.replacement = self.rollback = self.readiness = None
        self.switch = self.pending = self.labels = self.placement = None
        self.smoke_pod = self.verification = None
        self.before_hook = self.after_hook = None
        # What the next batch waits for (rollout.when_done): the pending GPU pods check and, on dra, the smoke
        # verification, which uncordons the node: the next gate counts a node still cordoned as unavailable.
        self.done_by: list[pulumi.Resource] = []
        # No node is touched, not even fenced, before the inventory found every GPU node listed: nothing half-applied.
        fence_opts = pulumi.ResourceOptions(parent=self, depends_on=[inventory])
        if node.stage == "ibm-managed":
            # The fence refuses a node already replaced (no IBM drivers) or missing, then sets both runbook labels
            # once; the NodePatch keeps only deploy.operands=false (see node_labels).
            self.fence = kube_providers.NodeFence(
                f"{node.ident}-fence",
                kubeconfig=cfg.kubeconfig,
                node=node.name,
                labels=node_labels.IBM_MANAGED_LABELS,
                operator_min_version=OPERATOR_MIN_VERSION,
                stage="ibm-managed",
                opts=fence_opts,
            )
            self.labels = self._labels([self.fence])
        else:
            # Until its worker is replaced the node still runs IBM's drivers: keep the GPU Operator off it.
            # (The replacement is a new Node object without these labels, so nothing has to remove them.)
            self.fence = kube_providers.NodeFence(
                f"{node.ident}-fence",
                kubeconfig=cfg.kubeconfig,
                node=node.name,
                labels=node_labels.IBM_MANAGED_LABELS,
                operator_min_version=OPERATOR_MIN_VERSION,
                opts=fence_opts,
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
        operator_namespace: pulumi.Input[str],
        fenced: Optional[pulumi.Input[list[str]]] = None,
        evict: Optional[dict[str, Any]] = None,
    ) -> None:
        """Replace the worker (after `after`), switch it to its stage's path, verify a rollback, check readiness."""
        node, cfg, ctx, t = self.node, self.cfg, self.ctx, self.cfg.timeouts
        self.before_hook = hooks.node_hook(
            "before-replace", cfg.hooks.before_replace, node, node.name, node.worker_id,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, self.fence]),
        )
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
            # The only GPU node is replaced only with a temporary GPU pool to take its workloads.
            single_gpu_node=len(cfg.nodes) == 1 and not cfg.temp_gpu_pool.enabled,
            # Before each replaceWorker (also on a kubeVersion bump) the node is cordoned and its pods evicted.
            evict=evict,
            opts=pulumi.ResourceOptions(parent=self,
                                        depends_on=[*after, *filter(None, [self.fence, self.before_hook])]),
        )
        self.hostname = self.replacement.node_name
        self.hostname.apply(lambda actual: _warn_renamed(node, actual))

        # Device plugin <-> DRA, step by step (never both paths at once); a no-op when the node is already there.
        self.switch = node_switch.NodePathSwitch(
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
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.replacement, *filter(None, [self.before_hook])]),
        )
        if node.stage == "device-plugin":
            self.rollback = kube_providers.RollbackVerification(
                f"{node.ident}-rollback",
                kubeconfig=cfg.kubeconfig,
                node=self.hostname,
                rolling_back=self.switch.rolling_back,
                extended_resource=cfg.device_plugin_resource,  # the check pod must get its GPU from the plugin
                image=cfg.smoke_test.image,
                namespace=cfg.smoke_test.namespace,
                timeout=t.smoke_test,
                poll_interval=t.poll_interval,
                tolerations=cfg.tolerations,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.switch]),
            )

        # Operand pods up and GPUs allocatable on the replaced node; the next batch waits for this.
        self.readiness = kube_providers.OperatorReadiness(
            f"{node.ident}-operator-ready",
            kubeconfig=cfg.kubeconfig,
            node=self.hostname,
            stage=node.stage,
            namespace=operator_namespace,  # resolves once the operator, its placement check and DRA driver are in
            driver=cfg.dra_driver_name,
            device_plugin_resource=cfg.device_plugin_resource,
            dra_namespace=cfg.dra_driver.namespace if node.stage == "dra" else None,
            config_name=node.name,
            timeout=t.operator_ready,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.switch, *filter(None, [self.replacement, self.rollback])]
            ),
        )
        # Operands start asynchronously after the install: check their placement again once this node is ready.
        checked: list[pulumi.Resource] = [self.readiness]
        if fenced is not None:
            self.placement = kube_providers.OperandPlacement(
                f"{node.ident}-operand-placement", kubeconfig=cfg.kubeconfig, namespace=cfg.gpu_operator.namespace,
                fenced=fenced, operator_min_version=OPERATOR_MIN_VERSION,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.readiness]),
            )
            checked = [self.placement]
        # The runbook expects Pending GPU workloads to run once the node's driver is in: report (or gate on) them.
        self.pending = kube_providers.PendingGpuPods(
            f"{node.ident}-pending-gpu-pods",
            kubeconfig=cfg.kubeconfig,
            node=self.hostname,
            resources=sorted({cfg.device_plugin_resource, cfg.extended_resource_name}),
            gate=cfg.pending_gpu_pods_gate,
            opts=pulumi.ResourceOptions(parent=self, depends_on=checked),
        )
        self.done_by = [self.pending]

    def declare_smoke_test(self, cfg: MigrationConfig, ctx: "Context", deps: list[pulumi.Resource]) -> None:
        self.smoke_pod = smoke_test.smoke_pod(
            self.node.ident,
            self.hostname,
            cfg.smoke_test,
            cfg.extended_resource_name,
            cfg.pilot_label_pair,
            tolerations=cfg.tolerations,
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
            dra_namespace=cfg.dra_driver.namespace,
            timeout=t.smoke_test,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.smoke_pod]),
        )
        self.done_by.append(self.verification)


    def declare_after_hook(self) -> None:
        """After everything that verifies this node: its path switch, readiness, operand placement, pending GPU pods,
        rollback check, smoke verification."""
        checks = [r for r in (self.switch, self.readiness, self.placement, self.pending, self.rollback,
                              self.verification) if r is not None]
        self.after_hook = hooks.node_hook(
            "after-verification", self.cfg.hooks.after_verification, self.node, self.hostname,
            self.replacement.new_worker_id, opts=pulumi.ResourceOptions(parent=self, depends_on=checks),
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
    # Every GPU node of the cluster must be in the config before anything changes (never the operator next to IBM's
    # drivers on a node the config forgot).
    out.inventory = kube_providers.GpuNodeInventory(
        "gpu-node-inventory",
        kubeconfig=cfg.kubeconfig,
        configured={n.name: n.stage for n in cfg.nodes},
        worker_ids={n.worker_id: n.name for n in cfg.nodes},
        operator_min_version=OPERATOR_MIN_VERSION,
        temp_pool=cfg.temp_gpu_pool.name if cfg.temp_gpu_pool.enabled else None,
    )
    if not cfg.one_name_on_both_paths:
        pulumi.log.warn(
            f"extendedResourceName {cfg.extended_resource_name} differs from devicePluginResourceName "
            f"{cfg.device_plugin_resource}: pods must request {cfg.extended_resource_name} to land on dra nodes and "
            f"{cfg.device_plugin_resource} elsewhere; only nvidia.com/gpu gives one name on both paths")
    # DRA driver values are checked (and the DeviceClass decided) before anything is declared: errors at preview.
    dra_nodes_configured = bool(cfg.nodes_in("dra"))
    own_class = True
    if dra_nodes_configured:
        values = charts.dra_values(cfg.dra_driver, cfg.pilot_label_pair, cfg.tolerations)
        own_class = dra.own_class_needed(cfg.extended_resource_name, cfg.dra_driver_name, cfg.device_selectors,
                                         charts.chart_class_maps(cfg.dra_driver, values))

    out.master = iks_providers.MasterVersion(
        "master-version",
        cluster=cfg.cluster_name,
        version=cfg.kube_version,
        api=ctx.ibm_api,
        timeout=t.master_update,
        poll_interval=t.poll_interval,
        opts=pulumi.ResourceOptions(depends_on=[out.inventory]),
    )
    after: list[pulumi.Resource] = [out.master, out.inventory]
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
    gpu_nodes = [GpuNode(n, cfg, ctx, out.inventory) for n in cfg.nodes]
    fences = [r for n in gpu_nodes for r in (n.fence, n.labels) if r is not None]
    fenced = pulumi.ResourceOptions(depends_on=[*fences, out.inventory])
    out.gpu_operator = charts.gpu_operator_release(cfg.gpu_operator, opts=pulumi.ResourceOptions.merge(k8s_opts, fenced))
    # The runbook's check: no operand pods on nodes that keep IBM's drivers (ibm-managed, or fenced until replaced).
    fenced_names = pulumi.Output.all(*[
        pulumi.Output.from_input(n.node.name) if n.node.stage == "ibm-managed"
        else n.fence.fenced.apply(lambda f, name=n.node.name: name if f else None)
        for n in gpu_nodes
    ]).apply(lambda names: sorted(filter(None, names)))
    out.operand_placement = kube_providers.OperandPlacement(
        "operand-placement", kubeconfig=cfg.kubeconfig, namespace=cfg.gpu_operator.namespace, fenced=fenced_names,
        operator_min_version=OPERATOR_MIN_VERSION,
        opts=pulumi.ResourceOptions(depends_on=[out.gpu_operator]),
    )
    readiness_deps: list[pulumi.Resource] = [out.gpu_operator, out.operand_placement]
    if dra_nodes_configured:
        # Kept while any node is dra; removed (after all updates) once none is. Both need the master at the target
        # version: resource.k8s.io/v1 DeviceClass.spec.extendedResourceName is dropped by an older API server.
        after_master = pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[out.master]))
        out.dra_driver = charts.dra_driver_release(cfg.dra_driver, cfg.pilot_label_pair, opts=after_master,
                                                   tolerations=cfg.tolerations)
        if own_class:
            out.device_class = dra.device_class(
                cfg.extended_resource_name, cfg.dra_driver_name, cfg.device_selectors, opts=after_master
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
    evict = eviction_settings(cfg, out.temp_pool)
    # What every node waits for goes as a value without dependency edges (rollout.once_done): the operator depends on
    # every fence, and an edge to it from each node makes the SDK's cycle check O(n^2).
    operator_namespace = rollout.once_done(cfg.gpu_operator.namespace, readiness_deps)
    # The temporary pool offers GPUs only once the operator runs there: the first gate waits for it.
    first_after = rollout.once_done([], [out.gpu_operator]) if out.temp_pool is not None else None
    # Every node's placement check reads the fenced names; their fences precede it through the operator already, so
    # the value goes without its n dependencies (constant edges per node: rollout.py).
    fenced_value = rollout.detached(fenced_names)
    namespace = smoke_test.smoke_namespace(cfg.smoke_test, opts=k8s_opts) if dra_nodes_configured else None

    def verify_dra(index: int, members: list[GpuNode]) -> None:
        """A batch's dra nodes: its preflight, then their smoke tests, whose verification uncordons them before the
        next batch's gate counts them. Per batch, not one preflight over every node: that one would wait for later
        batches' switches while they wait for this batch to be verified."""
        dra_members = [n for n in members if n.node.stage == "dra"]
        if not dra_members:
            return
        preflight = kube_providers.DraPreflight(
            f"batch-{index}-dra-preflight",
            kubeconfig=cfg.kubeconfig,
            driver=cfg.dra_driver_name,
            extended_resource=cfg.extended_resource_name,
            dra_nodes=[n.hostname for n in dra_members],
            all_nodes=[n.hostname for n in members],
            device_plugin_resource=cfg.device_plugin_resource,
            device_class=dra.device_class_name(cfg.extended_resource_name) if own_class else charts.CHART_CLASS,
            pilot_label=cfg.pilot_label,  # dra nodes of other batches may publish (kube_checks.preflight)
            timeout=t.operator_ready,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(
                depends_on=[out.dra_driver, *filter(None, [out.device_class]), *(n.switch for n in dra_members),
                            *(n.readiness for n in dra_members)]
            ),
        )
        out.preflights.append(preflight)
        for gpu_node in dra_members:
            gpu_node.declare_smoke_test(cfg, ctx, [preflight, namespace])

    by_name = {n.node.name: n for n in gpu_nodes}
    out.gates = rollout.declare_batches(
        out.plan, by_name, cfg, after,
        lambda gpu_node, deps: gpu_node.migrate(deps, operator_namespace, fenced_value, evict), first_after,
        verify_dra,
    )
    migrated = [n for n in gpu_nodes if n.node.stage != "ibm-managed"]
    for gpu_node in gpu_nodes:
        gpu_node.register_outputs({"stage": gpu_node.node.stage})
    out.nodes = {n.node.ident: n for n in gpu_nodes}
    for gpu_node in migrated:
        gpu_node.declare_after_hook()
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
