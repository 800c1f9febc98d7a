"""Declares the whole migration for one stack from its validated config, in the order of operations.

  cluster identity (the kubeconfig's cluster is clusterName) -> GPU node inventory (every GPU node of the cluster
  listed; nothing is touched before) -> master version ->
  [temporary GPU pool] -> every node's fence (GpuNode) -> the GPU Operator, only once every node that keeps IBM's
  drivers is fenced, and its operand-placement check (GpuOperator) -> [DRA driver + DeviceClass after the master
  (DraPath)] -> the plan's turns (Rollout: a CapacityGate per node, registered only once a slot is free: at most
  maxUnavailable + surge nodes in flight), each node: [beforeReplace hook] -> worker replacement (budget re-check,
  drain, replaceWorker) -> path switch -> [rollback check] -> operator readiness -> operand placement -> pending GPU
  pods; a dra node: DRA preflight -> smoke pod -> smoke verification (which uncordons) -> [afterVerification hook].
"""
from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from ..config import OPERATOR_MIN_VERSION, MigrationConfig, sources
from ..iks.identity import ClusterIdentity
from ..iks.master import MasterVersion
from ..iks.pool import TempGpuPool
from ..iks.shared_cluster import SharedClusterReady
from ..kube.inventory import GpuNodeInventory
from ..plan import Plan, plan_for
from ..sdk_workarounds import once_done
from . import dra_path, rollout
from .gpu_node import Context, GpuNode
from .gpu_operator import GpuOperator


@dataclass
class Declared:
    """Handles on what was declared, for stack outputs and tests."""
    identity: Any = None
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


def ibm_api(cfg: MigrationConfig) -> dict[str, Any]:
    """IKS endpoints and the IAM API key (secret config `gpu-migration:ibmApiKey`, else IC_API_KEY in the provider)."""
    return {
        "endpoint": cfg.ibm_cloud.endpoint,
        "iam_endpoint": cfg.ibm_cloud.iam_endpoint,
        "api_key": pulumi.Config("gpu-migration").get_secret("ibmApiKey"),
    }


def eviction_settings(cfg: MigrationConfig, temp_pool: Any) -> dict[str, Any]:
    """kube/eviction.py settings for every WorkerReplacement: with a temporary pool, its nodes must offer GPUs first."""
    resources = list(dict.fromkeys([cfg.device_plugin_resource, "nvidia.com/gpu"]))
    settings = {
        "kubeconfig": cfg.kubeconfig,
        "timeout": cfg.timeouts.evict,
        "poll_interval": cfg.timeouts.poll_interval,
        "gpu_resources": resources,
        # kubectl drain's options (plan/drain.py), those set: every node's replacement stores them
        "drain": cfg.drain.model_dump(exclude_defaults=True),
    }
    if temp_pool is not None:
        settings["gpu_nodes"] = temp_pool.node_names
    return settings


def drain_budgets(cfg: MigrationConfig, plan: Plan, shared: Optional[dict[str, Any]] = None
                  ) -> dict[str, dict[str, Any]]:
    """Per migrated node (configured name): what its replacement checks again right before each drain
    (kube/drain_budget.py): the gate's selector and budget (and the shared budget's settings, if any), bounded like
    the gate; `batch` (the node and the nodes in flight beside it, as its gate admitted it) comes with its slot
    (in_flight). `round`: the set of slots it started in (workerPoolRules.canary everyBatch)."""
    budgets: dict[str, dict[str, Any]] = {}
    for turn in plan.batches:
        budgets[turn.node] = {"index": turn.index, "round": turn.round, "batch": [turn.node],
                              "selector": cfg.gpu_node_selector, "min_available": plan.budget.min_available,
                              "timeout": cfg.timeouts.capacity_gate, "poll_interval": cfg.timeouts.poll_interval,
                              **({"shared": shared} if shared else {})}
    return budgets


def in_flight(budget: dict[str, Any], slot: pulumi.Output) -> dict[str, Any]:
    """`budget` whose `batch` is the node and the nodes in flight beside it when its slot came (components/slots.py)."""
    node = budget["batch"][0]
    return {**budget, "batch": slot.apply(lambda s: [node, *[p for p in s["peers"] if p != node]])}


def declare(cfg: MigrationConfig) -> Declared:
    out = Declared()
    own_class = dra_path.own_class_for(cfg) if cfg.nodes_in("dra") else None  # bad DRA values fail here, at preview
    warn_two_names(cfg)
    warn_unpinned_image(cfg)
    # A pool stack (clusterComponents: false) declares Kubernetes resources only for ibm-managed nodes (their
    # NodePatch): without one it starts no Kubernetes provider plugin (about a second of every preview and up).
    uses_kubernetes = cfg.cluster_components or bool(cfg.nodes_in("ibm-managed"))
    provider = k8s.Provider("cluster", kubeconfig=cfg.kubeconfig) if cfg.kubeconfig and uses_kubernetes else None
    ctx = Context(k8s_provider=provider, ibm_api=ibm_api(cfg), chart_provider=chart_provider(cfg, provider))
    out.identity = ClusterIdentity("cluster-identity", cluster=cfg.cluster_name, kubeconfig=cfg.kubeconfig,
                                   api=ctx.ibm_api)
    out.inventory = inventory(cfg, out.identity)
    if not cfg.cluster_components:
        return declare_pool_stack(cfg, ctx, out)
    out.master = master_version(cfg, ctx, out.inventory)
    out.temp_pool = temp_gpu_pool(cfg, ctx, out.master)
    # The inventory comes before the master and every fence: an edge to it would only be stored with every node.
    after = [out.master, *filter(None, [out.temp_pool])]
    gpu_nodes = [GpuNode(n, cfg, ctx, out.inventory) for n in cfg.nodes]
    operator = GpuOperator(cfg, ctx, gpu_nodes, out.inventory)
    out.gpu_operator, out.operand_placement = operator.release, operator.placement
    ready_after: list[pulumi.Resource] = [operator.release, operator.placement]
    dra = dra_path.DraPath(cfg, ctx, out.master, own_class) if own_class is not None else None
    if dra is not None:
        out.dra_driver, out.device_class, out.preflights = dra.driver, dra.device_class, dra.preflights
        ready_after.append(dra.driver)
    # What every node waits for goes without dependency edges (sdk_workarounds.py, 2.): the operator depends on every
    # fence.
    operator_namespace = once_done(cfg.gpu_operator.namespace, ready_after)
    first_after = once_done([], [operator.release]) if out.temp_pool is not None else None  # the pool's GPUs first
    return roll_out(cfg, out, gpu_nodes, after, operator_namespace, first_after,
                    dra.verify_batch if dra is not None else None)


def roll_out(cfg: MigrationConfig, out: Declared, gpu_nodes: list[GpuNode], after: list[pulumi.Resource],
             operator_namespace: pulumi.Input[str], first_after: Optional[pulumi.Output], verify_batch: Any
             ) -> Declared:
    """The plan's batches (Rollout), every node's steps after its gate, then each node's after-verification hook."""
    out.plan = plan_for(cfg)
    rollout.show(out.plan)
    shared = rollout.shared_settings(cfg)
    evict, budgets = eviction_settings(cfg, out.temp_pool), drain_budgets(cfg, out.plan, shared)
    out.nodes = {n.node.ident: n for n in gpu_nodes}
    out.gates = rollout.Rollout(
        out.plan, {n.node.name: n for n in gpu_nodes}, cfg, after,
        lambda gpu_node, deps, slot: gpu_node.migrate(
            deps, operator_namespace, {**evict, "budget": in_flight(budgets[gpu_node.node.name], slot)}), first_after,
        verify_batch, shared, out.inventory.resume_first).gates
    for gpu_node in gpu_nodes:
        gpu_node.register_outputs({"stage": gpu_node.node.stage})
        if gpu_node.node.stage != "ibm-managed":
            gpu_node.declare_after_hook()
    return out


def declare_pool_stack(cfg: MigrationConfig, ctx: Context, out: Declared) -> Declared:
    """A stack of some worker pools (gpu-migration:workerPools) that leaves the master, the GPU Operator and the DRA
    path to the stack with clusterComponents: its nodes are fenced first (the operator goes in only once every
    stack fenced its own), and its first batch waits until the master is at the target and the operator runs."""
    ready = SharedClusterReady(
        "shared-cluster-ready", cluster=cfg.cluster_name, version=cfg.kube_version, api=ctx.ibm_api,
        kubeconfig=cfg.kubeconfig, namespace=cfg.gpu_operator.namespace, timeout=cfg.timeouts.master_update
        + cfg.timeouts.operator_ready, poll_interval=cfg.timeouts.poll_interval,
        opts=pulumi.ResourceOptions(depends_on=[out.inventory]))
    out.master = ready
    out.temp_pool = temp_gpu_pool(cfg, ctx, ready)
    after = [ready, *filter(None, [out.temp_pool])]  # ready and every fence come after the inventory
    gpu_nodes = [GpuNode(n, cfg, ctx, out.inventory) for n in cfg.nodes]
    return roll_out(cfg, out, gpu_nodes, after, once_done(cfg.gpu_operator.namespace, [ready]), None, None)


def chart_provider(cfg: MigrationConfig, cluster: Optional[k8s.Provider]) -> Optional[k8s.Provider]:
    """The Helm releases' identity (rbac/gpu-migration-charts.yaml): gpu-migration:chartKubeconfig, else the cluster's
    provider. Setting it later moves both releases to the new provider without reinstalling them while it points at
    the same cluster (pulumi-kubernetes provider.go DiffConfig replaces only when the kubeconfig's active cluster
    changes)."""
    if not cfg.chart_kubeconfig:
        return cluster
    return k8s.Provider("charts", kubeconfig=cfg.chart_kubeconfig)


def inventory(cfg: MigrationConfig, identity: pulumi.Resource) -> GpuNodeInventory:
    """Every GPU node of the cluster must be in the config before anything changes (never the operator next to IBM's
    drivers on a node the config forgot); first of all, the cluster must be clusterName (`identity`). Everything that
    changes something depends on the inventory."""
    return GpuNodeInventory(
        "gpu-node-inventory",
        kubeconfig=cfg.kubeconfig,
        configured={n.name: n.stage for n in cfg.nodes},
        worker_ids={n.worker_id: n.name for n in cfg.nodes},
        operator_min_version=OPERATOR_MIN_VERSION,
        temp_pool=cfg.temp_gpu_pool.name if cfg.temp_gpu_pool.enabled else None,
        worker_pools=cfg.worker_pools,
        shared_budget_namespace=cfg.shared_budget.namespace if cfg.shared_budget else None,
        permissions_scope=permission_scope(cfg),
        opts=pulumi.ResourceOptions(depends_on=[identity]),
    )


def permission_scope(cfg: MigrationConfig) -> dict[str, Any]:
    """What the inventory's permission preflight (kube/permissions.py) checks beyond the ClusterRole, so a refusal
    comes before the master update and the fences: the program's own DeviceClass by name; with clusterComponents the
    smoke namespace's Role and the chart identity (chartKubeconfig, else kubeconfig), which installs the Helm
    releases only after both."""
    scope: dict[str, Any] = {"device_class": dra_path.device_class_name(cfg.extended_resource_name)}
    if cfg.cluster_components:
        scope.update(smoke_namespace=cfg.smoke_test.namespace, smoke_pods=bool(cfg.nodes_in("dra")), charts=True,
                     chart_kubeconfig=cfg.chart_kubeconfig or "")
    return scope


def master_version(cfg: MigrationConfig, ctx: Context, inventory: pulumi.Resource) -> MasterVersion:
    """The master at the target version before any worker is replaced."""
    return MasterVersion("master-version", cluster=cfg.cluster_name, version=cfg.kube_version, api=ctx.ibm_api,
                         timeout=cfg.timeouts.master_update, poll_interval=cfg.timeouts.poll_interval,
                         opts=pulumi.ResourceOptions(depends_on=[inventory]))


def temp_gpu_pool(cfg: MigrationConfig, ctx: Context, master: pulumi.Resource) -> Optional[TempGpuPool]:
    """Surge capacity (and, with a single GPU node, somewhere for its GPU workloads to go)."""
    pool = cfg.temp_gpu_pool
    if not pool.enabled:
        return None
    return TempGpuPool("temp-gpu-pool", cluster=cfg.cluster_name, pool_name=pool.name, flavor=pool.flavor,
                       zone=pool.zone, vpc_id=pool.vpc_id, subnet_id=pool.subnet_id, size_per_zone=pool.size_per_zone,
                       api=ctx.ibm_api, timeout=cfg.timeouts.worker_pool, poll_interval=cfg.timeouts.poll_interval,
                       opts=pulumi.ResourceOptions(depends_on=[master]))


def warn_two_names(cfg: MigrationConfig) -> None:
    if not cfg.one_name_on_both_paths:
        pulumi.log.warn(
            f"extendedResourceName {cfg.extended_resource_name} differs from devicePluginResourceName "
            f"{cfg.device_plugin_resource}: pods must request {cfg.extended_resource_name} to land on dra nodes and "
            f"{cfg.device_plugin_resource} elsewhere; only nvidia.com/gpu gives one name on both paths")


def warn_unpinned_image(cfg: MigrationConfig) -> None:
    """Against a real cluster, an image by tag runs whatever the registry serves under it that day."""
    warning = sources.unpinned_image_warning("smokeTest.image", cfg.smoke_test.image)
    if warning and not cfg.local_environment:
        pulumi.log.warn(warning)


def export(out: Declared) -> None:
    """Per-node stage, worker and verification, read by operators and `pulumi stack output`."""
    for name, gpu_node in out.nodes.items():
        entry: dict[str, Any] = {"stage": gpu_node.node.stage, "workerId": gpu_node.node.worker_id,
                                 "configName": gpu_node.node.name, "nodeName": gpu_node.node.name}
        if gpu_node.replacement is not None:  # the worker and node as they are now (read by status)
            entry["replacedWorkerId"] = gpu_node.replacement.new_worker_id
            entry["nodeName"] = gpu_node.replacement.node_name
            entry["drained"] = gpu_node.replacement.drained
        if gpu_node.verification is not None:
            entry["smokeTest"] = gpu_node.verification.result
        pulumi.export(f"node:{name}", entry)
