"""Typed model of the stack config (Pulumi.<stack>.yaml, namespace `gpu-migration`).

Everything is validated here, before any resource is declared; errors name the key and the bad value, and `parse`
reports every problem at once:
  - a field's own rules live on the model (types, Field constraints, field validators);
  - rules across fields are `@cross_check(field, ...)` functions below, not pydantic model validators: pydantic skips
    model validators once any field fails and they can only name the whole model. A cross check runs on every
    field it names that is valid itself, and yields Problem(location, message) naming the exact key.
"""
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Optional, Union, get_args, get_origin

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from . import names
from .plan import PlanError, parse_max_unavailable, resolve_max_unavailable
from .versions import version_at_least

NAMESPACE = "gpu-migration"
Stage = Literal["ibm-managed", "device-plugin", "dra"]
STAGES = get_args(Stage)
MIN_MINOR = {"device-plugin": 36, "dra": 37}  # kube minor each stage needs

# Kubernetes name grammars (apimachinery validation).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*\Z")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_KUBE_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?(_\d+)?\Z")
# IKS worker IDs look like kube-<cluster id>-<pool>-<hash>-w1; they go into API paths, so plain ASCII only.
_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# Helm reads a version that is not a full MAJOR.MINOR.PATCH as a constraint ("25.10" matches any 25.10.x):
# helm pkg/repo/index.go IndexFile.Get -> Masterminds/semver/v3 NewConstraint, where missing parts are wildcards.
_EXACT_SEMVER = re.compile(r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?\Z")
# Label keys the pilot label must not take: the GPU Operator's per-node switches (gpu-operator
# controllers/state_manager.go reads nvidia.com/gpu.deploy.*) and the prefixes Kubernetes reserves for itself
# (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
_OPERATOR_SWITCH_PREFIX = "nvidia.com/gpu.deploy."
_RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io")
MAX_TIMEOUT = 7 * 24 * 3600  # a bounded wait needs a bound a person would choose
MIN_POLL_INTERVAL = 0.01  # below this a wait hammers the API server (tests poll every 0.02s against emulators)


class ConfigError(ValueError):
    """Stack config is invalid; the message lists every bad key and value."""


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(DNS_SUBDOMAIN.match(value))


def check_qualified_name(value: str, require_prefix: bool = False) -> str:
    """A label key / extended resource name: optional DNS-subdomain prefix, '/', name of <= 63 chars."""
    prefix, _, name = value.rpartition("/")
    if require_prefix and not prefix:
        raise ValueError(f"{value!r} needs a domain prefix, e.g. example.com/{value}")
    if prefix and not is_dns_subdomain(prefix):
        raise ValueError(f"{value!r}: prefix {prefix!r} is not a DNS subdomain")
    if len(name) > 63 or not _QUALIFIED_NAME.match(name):
        raise ValueError(f"{value!r}: name {name!r} must be <= 63 alphanumerics, '-', '_' or '.'")
    return value


def check_namespace(value: str) -> str:
    if len(value) > 63 or not re.match(rf"^{_DNS_LABEL}\Z", value):
        raise ValueError(f"namespace {value!r} is not a DNS label (lowercase alphanumerics and '-', <= 63 chars)")
    return value


def _is_number_type(annotation: Any) -> bool:
    """int/float, possibly Optional or Annotated; bool is not a number here."""
    if annotation in (int, float):
        return True
    if get_origin(annotation) is Union:
        args = [a for a in get_args(annotation) if a is not type(None)]
        return bool(args) and all(_is_number_type(a) for a in args)
    return False


class Model(BaseModel):
    # allow_inf_nan=False: "inf" or "nan" is never a meaningful timeout, count or interval.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, v: Any, info: ValidationInfo) -> Any:
        # Pydantic's lax mode reads true as 1; for every number field (also ones added later) that hides a typo.
        if isinstance(v, bool) and _is_number_type(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"a boolean ({str(v).lower()}) where a number belongs")
        return v


class Node(Model):
    name: str
    worker_id: str = Field(min_length=1)
    stage: Stage
    # Stable identity of the node's resources (default: name). Renaming the entry after a replacement is never
    # needed (the new worker and node are recorded in state); whoever renames keeps the old name here.
    key: Optional[str] = None

    @property
    def ident(self) -> str:
        return self.key or self.name

    @field_validator("name", "key")
    @classmethod
    def _node_name(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        if not is_dns_subdomain(v):
            raise ValueError(f"node name {v!r} is not a valid Kubernetes node name (DNS subdomain)")
        problems = names.node_name_problems(v)
        if problems:
            raise ValueError(f"node name {v!r} {'; '.join(problems)}")
        return v

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, v: str) -> str:
        if not _WORKER_ID.match(v):
            raise ValueError(f"worker ID {v!r} must be ASCII letters, digits, '-', '_' or '.' (no spaces), "
                             f"as `ibmcloud ks worker ls` prints it")
        return v


class HelmChart(Model):
    chart: str = Field(min_length=1)
    repo: str = ""  # empty for oci:// charts
    version: str = Field(min_length=1)
    namespace: str
    values: dict[str, Any] = {}

    @field_validator("version")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if not _EXACT_SEMVER.match(v):
            raise ValueError(f"chart version {v!r} must be pinned to one exact version, e.g. v25.10.1 "
                             f"(Helm reads anything else, even 25.10, as a range)")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return check_namespace(v)


class SmokeTest(Model):
    image: str = Field(min_length=1)
    namespace: str = "gpu-pilot"
    # Prints the allocated GPU (UUID) and runs a GPU operation; non-zero exit fails verification. It then holds the
    # GPU for a minute: the verification reads the pod's ResourceClaim while the pod runs, because the resourceclaim
    # controller deletes it once the pod is done (kubernetes pkg/controller/resourceclaim/controller.go).
    command: list[str] = ["sh", "-c",
                          "nvidia-smi -L && nvidia-smi --query-gpu=uuid,name --format=csv,noheader && sleep 60"]

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return check_namespace(v)


def _is_loopback(host: Optional[str]) -> bool:
    return host in ("localhost", "127.0.0.1", "::1")


class Taint(Model):
    """A taint the GPU nodes carry (e.g. from the IKS worker pool); GPU pods this program runs tolerate it."""
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        return check_qualified_name(v)

    def toleration(self) -> dict[str, str]:
        if self.value:
            return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}
        return {"key": self.key, "operator": "Exists", "effect": self.effect}


class IbmCloud(Model):
    endpoint: str = "https://containers.cloud.ibm.com/global"
    iam_endpoint: str = "https://iam.cloud.ibm.com"

    @field_validator("endpoint", "iam_endpoint")
    @classmethod
    def _https(cls, v: str) -> str:
        # The API key and IAM tokens travel to these; plain http only to a local emulator.
        url = urllib.parse.urlsplit(v)
        if not url.hostname or not (url.scheme == "https" or (url.scheme == "http" and _is_loopback(url.hostname))):
            raise ValueError(f"{v!r} is not an https:// URL")
        return v


class TempGpuPool(Model):
    enabled: bool = False
    name: str = "gpu-migration-temp"
    flavor: str = ""
    zone: str = ""
    vpc_id: str = ""
    subnet_id: str = ""
    size_per_zone: int = Field(default=1, ge=1)


class Timeouts(Model):
    """Seconds; every long wait is bounded by one of these."""
    master_update: float = Field(default=3600, gt=0)
    worker_replace: float = Field(default=5400, gt=0)
    worker_pool: float = Field(default=3600, gt=0)
    operator_ready: float = Field(default=1800, gt=0)
    smoke_test: float = Field(default=600, gt=0)
    drain: float = Field(default=1800, gt=0)  # GPU pods to finish/move before a node switches path (either way)
    # The node's device-plugin allocatable to reach 0, or its ResourceSlices to be wiped (the kubelet wipes a DRA
    # driver's slices ~30 s after its plugin unregisters: kubernetes pkg/kubelet/cm/dra).
    path_switch: float = Field(default=300, gt=0)
    evict: float = Field(default=1800, gt=0)  # cordon + evict a node's pods before its worker is replaced
    capacity_gate: float = Field(default=3600, gt=0)  # a batch waits this long for capacity (plan.gate_decision)
    poll_interval: float = Field(default=15, gt=0)

    @field_validator("*")
    @classmethod
    def _sensible(cls, v: float, info: ValidationInfo) -> float:
        if v > MAX_TIMEOUT:
            raise ValueError(f"{v:g}s is more than {MAX_TIMEOUT // 86400} days")
        if info.field_name == "poll_interval" and v < MIN_POLL_INTERVAL:
            raise ValueError(f"{v:g}s is too small: at least {MIN_POLL_INTERVAL}s between polls")
        return v


class Hooks(Model):
    """Shell commands run on the machine running `pulumi up`, per migrated node (see hooks.py)."""
    before_replace: Optional[str] = None  # before the node's worker replacement and path switch (drain)
    after_verification: Optional[str] = None  # after the node's readiness and, on dra, its smoke test passed

    @field_validator("before_replace", "after_verification")
    @classmethod
    def _not_blank(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.strip():
            raise ValueError("is empty; leave the key out to run no hook")
        return v


class MigrationConfig(Model):
    cluster_name: str = Field(min_length=1)
    kube_version: str
    nodes: list[Node] = Field(min_length=1)
    gpu_operator: HelmChart
    dra_driver: HelmChart
    # nvidia.com/gpu: the name the device plugin already serves, so existing pods keep their requests and one name
    # is on both paths (the case KEP-5004 was designed for: kubernetes/enhancements keps/sig-scheduling/5004-*).
    extended_resource_name: str = "nvidia.com/gpu"
    # What the operator's device plugin advertises. Always under nvidia.com/: the plugin forces that prefix and has
    # resource renaming disabled (NVIDIA/k8s-device-plugin api/config/v1/resources.go, DisableResourceNamingInConfig).
    device_plugin_resource_name: str = "nvidia.com/gpu"
    dra_driver_name: str = "gpu.nvidia.com"  # NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin (DriverName)
    gpu_taints: list[Taint] = []  # taints of the GPU nodes: the smoke pod and the DRA kubelet plugin tolerate them
    # After each node: report GPU pods still Pending with their scheduling reason; true: fail `up` on any.
    pending_gpu_pods_gate: bool = False
    pilot_label: str = "migration.example.com/gpu-dra=pilot"
    smoke_test: SmokeTest
    device_selectors: list[str] = []  # extra CEL expressions, e.g. on device memory
    ibm_cloud: IbmCloud = IbmCloud()
    temp_gpu_pool: TempGpuPool = TempGpuPool()
    timeouts: Timeouts = Timeouts()
    kubeconfig: Optional[str] = None  # path; default is KUBECONFIG / ~/.kube/config
    hooks: Hooks = Hooks()
    # Capacity budget (iks_gpu_migration.plan): GPU nodes unavailable at once, a count or "NN%" of `nodes`.
    max_unavailable: Union[int, str] = 1
    batch_soak_seconds: float = Field(default=0, ge=0)  # wait between batches
    # Counts GPU nodes the config does not name (replaced nodes, temporary pool workers) towards capacity.
    gpu_node_selector: str = "nvidia.com/gpu.present=true"

    @field_validator("max_unavailable", mode="before")
    @classmethod
    def _max_unavailable(cls, v: Any) -> Union[int, str]:
        return parse_max_unavailable(v)

    @field_validator("gpu_node_selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is empty: the capacity gates count the GPU nodes it matches (e.g. "
                             "nvidia.com/gpu.present=true)")
        for term in filter(str.strip, v.split(",")):
            key, sep, value = term.strip().partition("=")
            if not sep or not _LABEL_VALUE.match(value):
                raise ValueError(f"gpuNodeSelector term {term!r} must be key=value")
            check_qualified_name(key)
        return v

    @field_validator("kube_version")
    @classmethod
    def _kube_version(cls, v: str) -> str:
        if not _KUBE_VERSION.match(v):
            raise ValueError(f"kube version {v!r} is not like 1.36 or 1.36.2_1530")
        return v

    @field_validator("extended_resource_name", "device_plugin_resource_name")
    @classmethod
    def _extended_resource(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        check_qualified_name(v, require_prefix=True)
        prefix = v.split("/")[0]
        if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or v.startswith("requests."):
            raise ValueError(f"{v!r} is in a reserved namespace; extended resources need your own domain")
        return v

    @field_validator("device_plugin_resource_name")
    @classmethod
    def _device_plugin_resource(cls, v: str) -> str:
        if not v.startswith("nvidia.com/"):
            raise ValueError(
                f"{v!r}: the NVIDIA device plugin only advertises names under nvidia.com/ (e.g. nvidia.com/gpu, "
                "nvidia.com/mig-1g.10gb); resource renaming is disabled in the plugin"
            )
        return v

    @field_validator("dra_driver_name")
    @classmethod
    def _driver(cls, v: str) -> str:
        if len(v) > 63 or not DNS_SUBDOMAIN.match(v):
            raise ValueError(f"DRA driver name {v!r} must be a lowercase DNS subdomain of <= 63 chars")
        return v

    @field_validator("pilot_label")
    @classmethod
    def _pilot_label(cls, v: str) -> str:
        key, sep, value = v.partition("=")
        if not sep:
            raise ValueError(f"pilot label {v!r} must be key=value")
        check_qualified_name(key)
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ValueError(f"pilot label {v!r}: value {value!r} is not a valid label value")
        if key.startswith(_OPERATOR_SWITCH_PREFIX):
            raise ValueError(f"pilot label {v!r} collides with the GPU Operator's {_OPERATOR_SWITCH_PREFIX}* switches")
        prefix = key.rpartition("/")[0]
        if any(prefix == d or prefix.endswith(f".{d}") for d in _RESERVED_LABEL_DOMAINS):
            raise ValueError(f"pilot label {v!r} uses the reserved prefix {prefix!r}; use your own domain, "
                             f"e.g. migration.example.com/gpu-dra=pilot")
        return v

    @field_validator("device_selectors")
    @classmethod
    def _cel(cls, v: list[str]) -> list[str]:
        bad = [f"[{i}] {problem}" for i, expr in enumerate(v) if (problem := cel_problem(expr))]
        if bad:
            raise ValueError("CEL selector does not parse: " + "; ".join(bad))
        return v

    @field_validator("kubeconfig")
    @classmethod
    def _kubeconfig_exists(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not os.path.isfile(os.path.expanduser(v)):
            raise ValueError(f"kubeconfig file {v!r} does not exist")
        return v

    # Derived views used by the components.
    @property
    def device_plugin_resource(self) -> str:
        return self.device_plugin_resource_name

    @property
    def one_name_on_both_paths(self) -> bool:
        return self.extended_resource_name == self.device_plugin_resource_name

    @property
    def tolerations(self) -> list[dict[str, str]]:
        return [t.toleration() for t in self.gpu_taints]

    @property
    def pilot_label_pair(self) -> tuple[str, str]:
        key, _, value = self.pilot_label.partition("=")
        return key, value

    @property
    def surge(self) -> int:
        """Temporary GPU pool workers: surge capacity that lets batches hold more nodes (plan.Budget)."""
        return self.temp_gpu_pool.size_per_zone if self.temp_gpu_pool.enabled else 0

    def nodes_in(self, *stages: str) -> list[Node]:
        return [n for n in self.nodes if n.stage in stages]


def cel_problem(expression: str) -> Optional[str]:
    """None if `expression` parses as CEL (syntax only: the API server type-checks it), else where it fails."""
    import celpy  # cel-python; imported here so modules that only read config don't pay for the parser

    try:
        celpy.Environment().compile(expression)
    except celpy.CELParseError as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else "syntax error"
        return f"{expression!r}: {first_line}"
    return None


FIELDS = {f.alias or name for name, f in MigrationConfig.model_fields.items()}


# --- Checks across fields ---------------------------------------------------------------------------------------

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


@cross_check("timeouts")
def _poll_below_timeouts(cfg: MigrationConfig) -> Iterable[Problem]:
    t = cfg.timeouts
    shortest = min((getattr(t, f), f) for f in Timeouts.model_fields if f != "poll_interval")
    if t.poll_interval >= shortest[0]:
        yield Problem(("timeouts", "pollInterval"), f"{t.poll_interval:g}s is not below timeouts."
                                                    f"{to_camel(shortest[1])} ({shortest[0]:g}s): nothing would be "
                                                    f"polled twice")


# --- Parsing and reporting --------------------------------------------------------------------------------------


def _loc_text(loc: Loc) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")


def _problems(error: ValidationError) -> list[Problem]:
    out = []
    for e in error.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("literal_error",):
            msg = f"{e['input']!r} is not one of {', '.join(STAGES)}"
        elif e["type"] == "extra_forbidden":
            msg = f"unknown key (got {e['input']!r})"
        elif e["type"] == "missing":
            msg = "is required"
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{msg} (got {e['input']!r})"
        out.append(Problem(tuple(e["loc"]), msg))
    return out


def _format(problems: list[Problem]) -> str:
    lines = [f"  {NAMESPACE}:{_loc_text(p.loc)}: {p.message}" if p.loc else f"  {NAMESPACE}: {p.message}"
             for p in problems]
    return "invalid stack config:\n" + "\n".join(dict.fromkeys(lines))


def _partial(raw: dict[str, Any], failed: list[Problem]) -> tuple[MigrationConfig, set[str]]:
    """A model holding only the fields of `raw` that are valid on their own (typed as in a full parse), and their
    names. Invalid node entries become None so that indexes stay those of the config."""
    bad = {p.loc[0] for p in failed if p.loc}
    partial = MigrationConfig.model_construct()  # defaults for every optional field
    present: set[str] = set()
    for name, field in MigrationConfig.model_fields.items():
        alias = field.alias or name
        if alias not in raw:
            if not field.is_required():
                present.add(name)
        elif alias not in bad:
            try:  # runs the field's own validators, one field at a time
                MigrationConfig.__pydantic_validator__.validate_assignment(partial, name, raw[alias])
                present.add(name)
            except Exception:  # noqa: BLE001 - already reported by the full parse; the field is just left out
                pass
        elif name == "nodes" and isinstance(raw[alias], list):
            object.__setattr__(partial, name, [_valid_or_none(Node, entry) for entry in raw[alias]])
            present.add(name)
    return partial, present


def _valid_or_none(model: type[Model], value: Any) -> Optional[Model]:
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def parse(raw: dict[str, Any]) -> MigrationConfig:
    """Validate a dict of camelCase config values; raise ConfigError listing every problem."""
    problems: list[Problem] = []
    try:
        cfg = MigrationConfig.model_validate(raw)
        present = set(MigrationConfig.model_fields)
    except ValidationError as e:
        problems = _problems(e)
        cfg, present = _partial(raw, problems)
    for fields, check in CROSS_CHECKS:
        if set(fields) <= present:
            problems.extend(check(cfg))
    if problems:
        raise ConfigError(_format(problems))
    return cfg


def raw_from_pulumi() -> dict[str, Any]:
    """Every `gpu-migration:*` key of the current stack, JSON values decoded (unknown keys are kept so they fail)."""
    raw: dict[str, Any] = {}
    # The language host passes config via set_all_config (CONFIG); older hosts via PULUMI_CONFIG.
    everything = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    for env_key, value in everything.items():
        namespace, _, key = env_key.partition(":")
        if namespace != NAMESPACE or key in ("ibmApiKey",):  # the API key is a secret read on its own
            continue
        raw[key] = _decode(value)
    return raw


def _decode(value: Any) -> Any:
    """Objects and lists arrive JSON-encoded; scalars stay strings (so kubeVersion 1.37 is not a float)."""
    try:
        decoded = json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value
    return decoded if isinstance(decoded, (dict, list)) else value


def load() -> MigrationConfig:
    return parse(raw_from_pulumi())
