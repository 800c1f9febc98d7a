"""Kubernetes and IKS name grammars the config is checked against (apimachinery validation), and the bounds of waits."""
import re
from typing import Any, Union, get_args, get_origin


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
