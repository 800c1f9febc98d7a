"""Typed model of the stack config (Pulumi.<stack>.yaml, namespace `gpu-migration`).

Everything is validated here, before any resource is declared; errors name the key and the bad value, and `parse`
reports every problem at once:
  - a field's own rules live on the model (types, Field constraints, field validators);
  - rules across fields are `@cross_check(field, ...)` functions below, not pydantic model validators: pydantic skips
    model validators once any field fails and they can only name the whole model. A cross check runs on every
    field it names that is valid itself, and yields Problem(location, message) naming the exact key.
"""
import os
import urllib.parse
from typing import Any, Literal, Optional, Union, get_args

from pydantic import Field, ValidationInfo, field_validator

from ..plan import DEFAULT_GPU_NODE_SELECTOR, parse_max_unavailable
from . import sources
from .base import NAMESPACE, Model  # noqa: F401 - NAMESPACE: other modules read it from here
from .fleet import SharedBudget, TempGpuPool, WorkerPoolRules
from .grammar import (DNS_SUBDOMAIN, MAX_TIMEOUT, MIN_POLL_INTERVAL, _EXACT_SEMVER, _KUBE_VERSION, _LABEL_VALUE,
                      _OPERATOR_SWITCH_PREFIX, _RESERVED_LABEL_DOMAINS, _WORKER_ID,
                      check_equality_selector, check_namespace, check_qualified_name, node_name_problems)

Stage = Literal["ibm-managed", "device-plugin", "dra"]
STAGES = get_args(Stage)
MIN_MINOR = {"device-plugin": 36, "dra": 37}  # kube minor each stage needs
OPERATOR_MIN_VERSION = f"1.{MIN_MINOR['device-plugin']}"  # workers below it still run IBM-managed drivers


class ConfigError(ValueError):
    """Stack config is invalid; the message lists every bad key and value."""


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
        problems = node_name_problems(v)
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
    # Where the chart comes from (config/sources.py): a chart name in `repo` (https:// repository or oci:// registry),
    # oci://<registry>/<path>/<chart>[@sha256:<digest>] with `repo` empty, or a local path (local environment only).
    chart: str = Field(min_length=1)
    repo: str = ""
    version: str = Field(min_length=1)
    namespace: str
    values: dict[str, Any] = {}
    # Helm's provenance check (`helm install --verify`): the chart's .prov signature against `keyring` (GPG public
    # keys; Helm's default ~/.gnupg/pubring.gpg). Only for charts published with a .prov file.
    verify: bool = False
    keyring: Optional[str] = None

    @field_validator("chart")
    @classmethod
    def _chart(cls, v: str) -> str:
        return sources.check_chart(v)

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        return sources.check_repo(v)

    @field_validator("keyring")
    @classmethod
    def _keyring_exists(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not os.path.isfile(os.path.expanduser(v)):
            raise ValueError(f"keyring file {v!r} does not exist")
        return v

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
    # Also the rollback check pod's image. name[:tag][@sha256:<digest>]; a digest pins what runs (config/sources.py).
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

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        return sources.check_image(v)


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
    # The API key goes to iamEndpoint and IAM tokens to endpoint: only IBM Cloud's own hosts unless this is true
    # (a proxy, a test environment, the local emulators); cross_checks.py _ibm_cloud_hosts.
    allow_custom_endpoints: bool = False

    @field_validator("endpoint", "iam_endpoint")
    @classmethod
    def _https(cls, v: str) -> str:
        # The API key and IAM tokens travel to these; plain http only to a local emulator.
        url = urllib.parse.urlsplit(v)
        if not url.hostname or not (url.scheme == "https" or (url.scheme == "http" and _is_loopback(url.hostname))):
            raise ValueError(f"{v!r} is not an https:// URL")
        if url.username is not None or url.password is not None:
            raise ValueError(f"{v!r} carries credentials (user:password@); give the plain URL")
        return v

    @property
    def hosts(self) -> dict[str, str]:
        """Config key -> the host it points at."""
        return {"endpoint": urllib.parse.urlsplit(self.endpoint).hostname or "",
                "iamEndpoint": urllib.parse.urlsplit(self.iam_endpoint).hostname or ""}


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
    # A Helm release's install or upgrade, until all of its resources are ready (else `atomic` rolls it back): the GPU
    # Operator's includes NFD's worker DaemonSet rolling over every node (components/charts.py helm_release).
    helm: float = Field(default=7200, gt=0)
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


class WaitForCompletion(Model):
    """As the GPU Operator's driver upgrade policy `waitForCompletion` (k8s-operator-libs upgrade/: pods matching
    podSelector on the node finish before anything is evicted; after `timeout` the drain goes on and evicts them)."""
    pod_selector: str = Field(min_length=1)
    timeout: float = Field(default=3600, gt=0, le=MAX_TIMEOUT)

    @field_validator("pod_selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        check_equality_selector(v, "podSelector")
        return v


class Drain(Model):
    """How a node is drained before its worker is replaced: `kubectl drain`'s options (k8s.io/kubectl/pkg/drain)."""
    force: bool = False  # --force: also evict pods no controller re-creates (bare pods, orphaned DaemonSet pods)
    delete_empty_dir_data: bool = False  # --delete-emptydir-data: evict pods whose emptyDir data is then lost
    # --skip-wait-for-delete-timeout: stop waiting for a pod whose deletionTimestamp (the end of its grace period)
    # is more than this many seconds past; 0: wait for each one (kubectl drain filters.go shouldSkipPod).
    skip_wait_for_delete_timeout: float = Field(default=0, ge=0, le=MAX_TIMEOUT)
    gpu_pods_only: bool = False  # the GPU Operator's gpuPodDeletion: evict only pods that use a GPU
    wait_for_completion: Optional[WaitForCompletion] = None
    # The dra switch's GPU pods (kube/switch.py): "wait" until they end (bounded by timeouts.drain), or "evict" them
    # under these rules, PDBs respected (docs/operations.md, the dra switch).
    switch_gpu_pods: Literal["wait", "evict"] = "wait"


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
    worker_pool_rules: WorkerPoolRules = WorkerPoolRules()
    timeouts: Timeouts = Timeouts()
    kubeconfig: Optional[str] = None  # path; default is KUBECONFIG / ~/.kube/config
    # The Helm releases' own identity (rbac/gpu-migration-charts.yaml): a path; default `kubeconfig`.
    chart_kubeconfig: Optional[str] = None
    hooks: Hooks = Hooks()
    drain: Drain = Drain()
    # Capacity budget (iks_gpu_migration.plan): GPU nodes unavailable at once, a count or "NN%" of `nodes`.
    max_unavailable: Union[int, str] = 1
    batch_soak_seconds: float = Field(default=0, ge=0)  # wait between batches
    # Counts GPU nodes the config does not name (replaced nodes, temporary pool workers) towards capacity. The default
    # holds before the GPU Operator (IKS's label) and after it (the operator's): plan/gates.py.
    gpu_node_selector: str = DEFAULT_GPU_NODE_SELECTOR
    # A fleet split over several stacks, e.g. one per worker pool (docs/fleet-scale.md#one-fleet-several-stacks): this
    # stack's worker pools (its inventory covers only their GPU nodes), one budget for all the stacks
    # (plan/shared_budget.py), and whether this is the one stack that updates the master and installs the GPU
    # Operator and the DRA path.
    worker_pools: list[str] = []
    shared_budget: Optional[SharedBudget] = None
    cluster_components: bool = True

    @field_validator("worker_pools")
    @classmethod
    def _pools(cls, v: list[str]) -> list[str]:
        return WorkerPoolRules._names(v)

    @field_validator("max_unavailable", mode="before")
    @classmethod
    def _max_unavailable(cls, v: Any) -> Union[int, str]:
        return parse_max_unavailable(v)

    @field_validator("gpu_node_selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        if not v.strip():
            raise ValueError(f"is empty: the capacity gates count the GPU nodes it matches (e.g. "
                             f"{DEFAULT_GPU_NODE_SELECTOR})")
        for alternative in v.split("|"):  # key=value[,key=value], alternatives separated by |
            if not alternative.strip():
                raise ValueError(f"gpuNodeSelector {v!r} has an empty alternative: write key=value[,key=value] "
                                 f"between the | separators")
            check_equality_selector(alternative, "gpuNodeSelector")
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

    @field_validator("kubeconfig", "chart_kubeconfig")
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
    def local_environment(self) -> bool:
        """The local environment (gpu_migration_local: the IKS emulator on 127.0.0.1), where local charts are fine."""
        return _is_loopback(urllib.parse.urlsplit(self.ibm_cloud.endpoint).hostname)

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


# --- Parsing and reporting --------------------------------------------------------------------------------------


