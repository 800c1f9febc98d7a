"""Kubernetes and IKS name grammars the config is checked against (apimachinery validation), and the bounds of waits."""
import re
from typing import Any, Union, get_args, get_origin

from ..common import names


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


# IBM Cloud's hosts for the IKS and IAM APIs, public and private. A region is like us-south, eu-de, jp-osa, eu-fr2.
# IKS: the global endpoint, the regional ones (ibmcloud ks init --host https://<region>.containers.cloud.ibm.com),
# the private cloud service endpoint private.<region>.containers (terraform-provider-ibm ibm/conns/config.go, with
# /global) and the VPE form <region>.private.containers. IAM: iam, the VPC/VPE private endpoint private.iam, and the
# classic private endpoints private.<region>.iam (IAM Identity API docs "Endpoint URLs"; terraform-provider-ibm).
_REGION = r"[a-z]{2}-[a-z0-9]{2,6}"


IKS_HOSTS = ("containers.cloud.ibm.com", "<region>.containers.cloud.ibm.com",
             "private.<region>.containers.cloud.ibm.com", "<region>.private.containers.cloud.ibm.com")


IAM_HOSTS = ("iam.cloud.ibm.com", "private.iam.cloud.ibm.com", "private.<region>.iam.cloud.ibm.com")


def _hosts(forms: tuple[str, ...]) -> "re.Pattern[str]":
    alternatives = "|".join(re.escape(f).replace(re.escape("<region>"), _REGION) for f in forms)
    return re.compile(rf"^({alternatives})\Z")


_IKS_HOST, _IAM_HOST = _hosts(IKS_HOSTS), _hosts(IAM_HOSTS)


def is_ibm_cloud_host(host: str, iam: bool) -> bool:
    return bool((_IAM_HOST if iam else _IKS_HOST).match(host))


MAX_TIMEOUT = 7 * 24 * 3600  # a bounded wait needs a bound a person would choose


MIN_POLL_INTERVAL = 0.01  # below this a wait hammers the API server (tests poll every 0.02s against emulators)


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(DNS_SUBDOMAIN.match(value))


def node_name_problems(value: Any) -> list[str]:
    """Why `value` can't be a node name this program puts into field and label selectors and object names; [] if it
    can. The same rule for configured names (model.Node) and names read back from IKS (iks/workers.py)."""
    if not isinstance(value, str) or not is_dns_subdomain(value):
        return ["is not a valid Kubernetes node name (DNS subdomain)"]
    return names.node_name_problems(value)


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


def check_equality_selector(value: str, what: str) -> None:
    """`key=value[,key=value]`, a label selector of equality terms only (what the program matches itself)."""
    for term in filter(str.strip, value.split(",")):
        key, sep, label_value = term.strip().partition("=")
        if not sep or not _LABEL_VALUE.match(label_value):
            raise ValueError(f"{what} term {term!r} must be key=value")
        check_qualified_name(key)


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
