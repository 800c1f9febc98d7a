"""Typed model of the stack config (Pulumi.<stack>.yaml, namespace `gpu-migration`).

Everything is validated here, before any resource is declared; errors name the key and the bad value.
"""
import json
import re
from typing import Any, Literal, Optional, Union, get_args

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .plan import parse_max_unavailable, resolve_max_unavailable
from .versions import version_at_least

NAMESPACE = "gpu-migration"
Stage = Literal["ibm-managed", "device-plugin", "dra"]
STAGES = get_args(Stage)
MIN_MINOR = {"device-plugin": 36, "dra": 37}  # kube minor each stage needs

# Kubernetes name grammars (apimachinery validation).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_KUBE_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?(_\d+)?$")


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


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Node(Model):
    name: str
    worker_id: str = Field(min_length=1)
    stage: Stage

    @field_validator("name")
    @classmethod
    def _node_name(cls, v: str) -> str:
        if not is_dns_subdomain(v):
            raise ValueError(f"node name {v!r} is not a valid Kubernetes node name (DNS subdomain)")
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
        if re.search(r"[\^~*<>=|, ]|\.x\b|^latest$", v):
            raise ValueError(f"chart version {v!r} must be pinned to one exact version, e.g. v25.10.1")
        return v


class SmokeTest(Model):
    image: str = Field(min_length=1)
    namespace: str = "gpu-pilot"
    # Prints the allocated GPU (UUID) and runs a GPU operation; non-zero exit fails verification.
    command: list[str] = ["sh", "-c", "nvidia-smi -L && nvidia-smi --query-gpu=uuid,name --format=csv,noheader"]

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if len(v) > 63 or not re.match(rf"^{_DNS_LABEL}$", v):
            raise ValueError(f"namespace {v!r} is not a DNS label")
        return v


class IbmCloud(Model):
    endpoint: str = "https://containers.cloud.ibm.com/global"
    iam_endpoint: str = "https://iam.cloud.ibm.com"


class TempGpuPool(Model):
    enabled: bool = False
    name: str = "gpu-migration-temp"
    flavor: str = ""
    zone: str = ""
    vpc_id: str = ""
    subnet_id: str = ""
    size_per_zone: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _flavor_zone(self) -> "TempGpuPool":
        # A VPC worker pool needs all four; IKS would refuse it mid-`up` otherwise.
        missing = [to_camel(k) for k in ("flavor", "zone", "vpc_id", "subnet_id") if self.enabled and not getattr(self, k)]
        if missing:
            raise ValueError(f"tempGpuPool.enabled is true but {', '.join(missing)} is empty")
        return self


class Timeouts(Model):
    """Seconds; every long wait is bounded by one of these."""
    master_update: float = Field(default=3600, gt=0)
    worker_replace: float = Field(default=5400, gt=0)
    worker_pool: float = Field(default=3600, gt=0)
    operator_ready: float = Field(default=1800, gt=0)
    smoke_test: float = Field(default=600, gt=0)
    drain: float = Field(default=1800, gt=0)
    capacity_gate: float = Field(default=3600, gt=0)  # a batch waits this long for capacity (plan.gate_decision)
    poll_interval: float = Field(default=15, gt=0)


class MigrationConfig(Model):
    cluster_name: str = Field(min_length=1)
    kube_version: str
    nodes: list[Node] = Field(min_length=1)
    gpu_operator: HelmChart
    dra_driver: HelmChart
    extended_resource_name: str = "example.com/gpu"
    # What the operator's device plugin advertises; default: the extended resource name, so pods request one name
    # on both paths (configure the plugin's resource name in gpuOperator.values to match).
    device_plugin_resource_name: Optional[str] = None
    dra_driver_name: str = "gpu.example.com"
    pilot_label: str = "migration.example.com/gpu-dra=pilot"
    smoke_test: SmokeTest
    device_selectors: list[str] = []  # extra CEL expressions, e.g. on device memory
    ibm_cloud: IbmCloud = IbmCloud()
    temp_gpu_pool: TempGpuPool = TempGpuPool()
    timeouts: Timeouts = Timeouts()
    kubeconfig: Optional[str] = None  # path; default is KUBECONFIG / ~/.kube/config
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
        return v

    @model_validator(mode="after")
    def _unique_nodes(self) -> "MigrationConfig":
        for field in ("name", "worker_id"):
            seen: set[str] = set()
            for node in self.nodes:
                value = getattr(node, field)
                if value in seen:
                    raise ValueError(f"duplicate node {to_camel(field)} {value!r} in nodes")
                seen.add(value)
        return self

    @model_validator(mode="after")
    def _version_supports_stages(self) -> "MigrationConfig":
        """The GPU Operator path needs workers at >= 1.36, DRA extended resources >= 1.37."""
        for node in self.nodes:
            needed = MIN_MINOR.get(node.stage, 0)
            if not version_at_least(self.kube_version, f"1.{needed}"):
                raise ValueError(
                    f"node {node.name!r} is at stage {node.stage!r}, which needs kubeVersion >= 1.{needed} "
                    f"(got {self.kube_version!r})"
                )
        return self

    @model_validator(mode="after")
    def _budget(self) -> "MigrationConfig":
        resolve_max_unavailable(self.max_unavailable, len(self.nodes), self.surge)  # PlanError is a ValueError
        return self

    # Derived views used by the components.
    @property
    def device_plugin_resource(self) -> str:
        return self.device_plugin_resource_name or self.extended_resource_name

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


FIELDS = {f.alias or name for name, f in MigrationConfig.model_fields.items()}


def _format(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e["loc"]).replace(".[", "[")
        key = f"{NAMESPACE}:{loc}" if loc else NAMESPACE
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("literal_error",):
            msg = f"{e['input']!r} is not one of {', '.join(STAGES)}"
        elif e["type"] == "extra_forbidden":
            msg = f"unknown key (got {e['input']!r})"
        elif e["type"] == "missing":
            msg = "is required"
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  {key}: {msg}")
    return "invalid stack config:\n" + "\n".join(lines)


def parse(raw: dict[str, Any]) -> MigrationConfig:
    """Validate a dict of camelCase config values; raise ConfigError listing every problem."""
    try:
        return MigrationConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format(e)) from None


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
