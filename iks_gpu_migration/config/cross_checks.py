"""Rules across config fields: each `@cross_check(field, ...)` runs whenever the fields it names are valid on their own,
and yields Problem(location, message) naming the exact key (pydantic model validators would be skipped once any field
fails, and could only name the whole model)."""
from dataclasses import dataclass
from typing import Callable, Iterable, Union

from pydantic.alias_generators import to_camel

from ..common.versions import version_at_least
from ..plan import PlanError, resolve_max_unavailable
from . import sources
from .grammar import IAM_HOSTS, IKS_HOSTS, is_ibm_cloud_host
from .model import MIN_MINOR, MigrationConfig, Node, Timeouts


Loc = tuple[Union[str, int], ...]


@dataclass(frozen=True)
class Problem:
    loc: Loc  # camelCase keys and list indexes under gpu-migration:, e.g. ("nodes", 1, "stage")
    message: str


CrossCheck = Callable[[MigrationConfig], Iterable[Problem]]


CROSS_CHECKS: list[tuple[tuple[str, ...], CrossCheck]] = []


def cross_check(*fields: str) -> Callable[[CrossCheck], CrossCheck]:
    """Register a check over `fields` (snake_case); it runs whenever those fields are valid on their own."""
    def register(check: CrossCheck) -> CrossCheck:
        CROSS_CHECKS.append((fields, check))
        return check
    return register


def valid_nodes(cfg: MigrationConfig) -> Iterable[tuple[int, Node]]:
    """(index, node) of every node entry that is valid on its own (a partial config keeps the others as None)."""
    return ((i, n) for i, n in enumerate(cfg.nodes) if n is not None)


@cross_check("nodes")
def _unique_nodes(cfg: MigrationConfig) -> Iterable[Problem]:
    # ident (key, else name) names each node's resources, so it must be unique too.
    for field in ("name", "worker_id", "ident"):
        first: dict[str, int] = {}
        for i, node in valid_nodes(cfg):
            value = getattr(node, field)
            if value in first:
                where = ("key" if node.key else "name") if field == "ident" else to_camel(field)
                what = "key (or name)" if field == "ident" else to_camel(field)
                yield Problem(("nodes", i, where),
                              f"duplicate node {what} {value!r} in nodes (also nodes[{first[value]}])")
            first.setdefault(value, i)


@cross_check("nodes", "kube_version")
def _version_supports_stages(cfg: MigrationConfig) -> Iterable[Problem]:
    """The GPU Operator path needs workers at >= 1.36, DRA extended resources >= 1.37."""
    for i, node in valid_nodes(cfg):
        needed = MIN_MINOR.get(node.stage, 0)
        if not version_at_least(cfg.kube_version, f"1.{needed}"):
            yield Problem(("nodes", i, "stage"), f"node {node.name!r} is at stage {node.stage!r}, which needs "
                                                 f"kubeVersion >= 1.{needed} (got {cfg.kube_version!r})")


@cross_check("temp_gpu_pool")
def _temp_pool_complete(cfg: MigrationConfig) -> Iterable[Problem]:
    # A VPC worker pool needs all four; IKS would refuse it mid-`up` otherwise.
    pool = cfg.temp_gpu_pool
    if pool.enabled:
        for key in ("flavor", "zone", "vpc_id", "subnet_id"):
            if not getattr(pool, key):
                yield Problem(("tempGpuPool", to_camel(key)), "is required when tempGpuPool.enabled is true")


@cross_check("max_unavailable", "nodes", "temp_gpu_pool")
def _budget(cfg: MigrationConfig) -> Iterable[Problem]:
    """maxUnavailable must let the plan progress (plan.resolve_max_unavailable): 0 needs surge capacity."""
    try:
        resolve_max_unavailable(cfg.max_unavailable, len(cfg.nodes), cfg.surge)
    except PlanError as e:
        yield Problem(("maxUnavailable",), str(e))


@cross_check("shared_budget", "max_unavailable", "nodes", "temp_gpu_pool")
def _fits_shared_budget(cfg: MigrationConfig) -> Iterable[Problem]:
    """A batch larger than the shared budget could never be let out: every gate would wait until its timeout."""
    if cfg.shared_budget is None:
        return
    try:
        batch = resolve_max_unavailable(cfg.max_unavailable, len(cfg.nodes), cfg.surge) + cfg.surge
    except PlanError:
        return  # _budget names it
    if batch > cfg.shared_budget.max_unavailable:
        yield Problem(("sharedBudget", "maxUnavailable"),
                      f"is {cfg.shared_budget.max_unavailable}, smaller than this stack's batches of {batch} nodes "
                      f"(maxUnavailable {cfg.max_unavailable!r}{f' + surge {cfg.surge}' if cfg.surge else ''}): no "
                      f"batch could ever go out; lower gpu-migration:maxUnavailable or raise this")


@cross_check("worker_pools", "shared_budget", "cluster_components", "nodes")
def _split_fleet(cfg: MigrationConfig) -> Iterable[Problem]:
    """A stack of some worker pools runs beside other stacks of the same cluster: it needs the budget they share, and
    the stack without the cluster-wide parts can't hold dra nodes (their DRA driver, DeviceClass and preflight are
    the cluster-wide stack's)."""
    if cfg.worker_pools and cfg.shared_budget is None:
        yield Problem(("sharedBudget",), "is required with workerPools: the stacks that share the cluster's GPU nodes "
                                         "need one budget for all of them, e.g. {name: gpu-fleet, maxUnavailable: 10}")
    if not cfg.cluster_components and not cfg.worker_pools:
        yield Problem(("workerPools",), "is required with clusterComponents: false: name the worker pools this stack "
                                        "migrates (another stack, with clusterComponents, has the others)")
    if not cfg.cluster_components:
        for i, node in valid_nodes(cfg):
            if node.stage == "dra":
                yield Problem(("nodes", i, "stage"),
                              f"node {node.name!r} is dra in a stack with clusterComponents: false; dra nodes belong "
                              f"in the stack with clusterComponents (it installs the DRA driver and DeviceClass and "
                              f"runs their preflight)")


@cross_check("timeouts")
def _poll_below_timeouts(cfg: MigrationConfig) -> Iterable[Problem]:
    t = cfg.timeouts
    shortest = min((getattr(t, f), f) for f in Timeouts.model_fields if f != "poll_interval")
    if t.poll_interval >= shortest[0]:
        yield Problem(("timeouts", "pollInterval"), f"{t.poll_interval:g}s is not below timeouts."
                                                    f"{to_camel(shortest[1])} ({shortest[0]:g}s): nothing would be "
                                                    f"polled twice")


@cross_check("gpu_operator", "dra_driver", "ibm_cloud")
def _chart_sources(cfg: MigrationConfig) -> Iterable[Problem]:
    """A chart against its repo and version; local charts only in the local environment (config/sources.py)."""
    for key, chart in (("gpuOperator", cfg.gpu_operator), ("draDriver", cfg.dra_driver)):
        for field, message in sources.chart_problems(chart.chart, chart.repo, chart.version, cfg.local_environment):
            yield Problem((key, field), message)
        if chart.keyring is not None and not chart.verify:
            yield Problem((key, "keyring"), "is read only with verify: true; set verify: true or leave keyring out")


@cross_check("ibm_cloud")
def _ibm_cloud_hosts(cfg: MigrationConfig) -> Iterable[Problem]:
    """One config line would otherwise send the API key (to iamEndpoint) or IAM tokens (to endpoint) elsewhere."""
    ibm = cfg.ibm_cloud
    if ibm.allow_custom_endpoints:
        return
    for key, host in ibm.hosts.items():
        iam = key == "iamEndpoint"
        if not is_ibm_cloud_host(host, iam):
            what = "the API key" if iam else "IAM tokens"
            yield Problem(("ibmCloud", key), f"host {host} is not an IBM Cloud {'IAM' if iam else 'IKS'} endpoint "
                                             f"({', '.join(IAM_HOSTS if iam else IKS_HOSTS)}), and {what} would be "
                                             f"sent there; to trust it anyway (a proxy, a test environment, a local "
                                             f"emulator) set gpu-migration:ibmCloud.allowCustomEndpoints: true")
