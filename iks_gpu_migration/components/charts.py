"""Helm releases: the NVIDIA GPU Operator and the DRA driver.

The DRA driver's values are rendered here and checked before anything is declared, so a chart that would refuse to
install (or install a controller that can never schedule on IKS) fails `pulumi preview` with the key to fix.
"""
import copy
import math
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from ..common.versions import version_at_least
from ..config import ConfigError, HelmChart, sources
from ..config.model import Timeouts
from ..plan.gates import IKS_GPU_LABEL

# NVIDIA/k8s-dra-driver-gpu deployments/helm/nvidia-dra-driver-gpu (v25.8.1, v25.12.0):
# - templates/validation.yaml fails the install when resources.gpus.enabled is true without
#   gpuResourcesEnabledOverride: true (values.yaml defaults: gpus.enabled true, override false);
# - templates/controller.yaml deploys the ComputeDomain controller when resources.computeDomains.enabled (default
#   true); values.yaml gives it a nodeAffinity to node-role.kubernetes.io/control-plane nodes, which IKS (managed
#   masters) doesn't have, so it stays Pending and `atomic` rolls the release back.
DRA_DEFAULTS: dict[str, Any] = {
    "gpuResourcesEnabledOverride": True,
    "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}},
}
# From 25.12 templates/deviceclass-gpu.yaml gives the chart's DeviceClass gpu.nvidia.com
# `extendedResourceName: nvidia.com/gpu` (when resource.k8s.io/v1 is served); there is no value to turn that off.
CHART_CLASS_MAPS_FROM = "25.12"
CHART_CLASS, CHART_CLASS_RESOURCE = "gpu.nvidia.com", "nvidia.com/gpu"

# The GPU Operator's own controllers (its Deployment; NFD's master and garbage collector, the chart's subchart) are
# best off on workers this migration never drains. A drain of the worker they run on restarts them, and a restarted
# operator labels no new GPU node until it holds its leader Lease again: the evicted one never released it
# (controller-runtime LeaseDuration 15 s, ReleaseOnCancel false), so every new node of that batch waits ~17 s more
# (measured with benchmarks/real_fleet.py). The chart prefers control-plane nodes (values.yaml operator.affinity,
# node-feature-discovery master.affinity), which IKS doesn't show; IKS labels GPU workers
# ibm-cloud.kubernetes.io/gpu-enabled=true (plan/gates.py), so these also prefer workers without it. Preferred, not
# required: on a cluster of GPU workers only they still run, as before.
_CHART_PREFERENCES = [
    {"weight": 1, "preference": {"matchExpressions": [{"key": f"node-role.kubernetes.io/{role}", "operator": "In",
                                                       "values": [""]}]}} for role in ("master", "control-plane")]
_OFF_GPU_WORKERS = {"weight": 100, "preference": {"matchExpressions": [
    {"key": IKS_GPU_LABEL, "operator": "DoesNotExist"}]}}
_CONTROLLER_AFFINITY = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    _OFF_GPU_WORKERS, *_CHART_PREFERENCES]}}
OPERATOR_DEFAULTS: dict[str, Any] = {
    "operator": {"affinity": _CONTROLLER_AFFINITY},
    "node-feature-discovery": {"master": {"affinity": _CONTROLLER_AFFINITY}, "gc": {"affinity": _CONTROLLER_AFFINITY}},
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` wins; nested dicts are merged, not replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _get(values: dict[str, Any], path: str, default: Any = None) -> Any:
    for part in path.split("."):
        if not isinstance(values, dict) or part not in values:
            return default
        values = values[part]
    return values


def dra_values(chart: HelmChart, pilot_label: tuple[str, str], tolerations: list[dict[str, str]]) -> dict[str, Any]:
    """What the DRA driver release gets: DRA_DEFAULTS, then the stack's values (they win), then the pilot-label pin
    (ANDed by the chart with its own GPU-node affinity, templates/kubeletplugin.yaml) and the GPU taints' tolerations
    (values.yaml kubeletPlugin.tolerations defaults to [])."""
    values = deep_merge(DRA_DEFAULTS, chart.values)
    pinned = {"kubeletPlugin": {"nodeSelector": {pilot_label[0]: pilot_label[1]}}}
    values = deep_merge(values, pinned)
    if tolerations:
        own = list(_get(values, "kubeletPlugin.tolerations", []) or [])
        values["kubeletPlugin"]["tolerations"] = own + [t for t in tolerations if t not in own]
    return values


def dra_values_problems(values: dict[str, Any]) -> list[str]:
    """Rendered DRA driver values the chart would refuse, or that cannot work on IKS."""
    problems = []
    if _get(values, "resources.gpus.enabled", True) is not True:
        problems.append("resources.gpus.enabled is not true: the driver would publish no GPUs for the DeviceClass")
    elif _get(values, "gpuResourcesEnabledOverride") is not True:
        problems.append("resources.gpus.enabled is true but gpuResourcesEnabledOverride is not: the chart's "
                        "templates/validation.yaml refuses to install; set gpuResourcesEnabledOverride: true")
    if _get(values, "resources.computeDomains.enabled", True) and not _get(values, "controller.affinity"):
        problems.append("resources.computeDomains.enabled is true and controller.affinity is not set: the "
                        "ComputeDomain controller needs a node-role.kubernetes.io/control-plane node, which IKS "
                        "doesn't have; set resources.computeDomains.enabled: false or your own controller.affinity")
    return problems


def chart_class_maps(chart: HelmChart, values: dict[str, Any]) -> Optional[str]:
    """The extended resource the chart's own DeviceClass maps, if any."""
    if _get(values, "resources.gpus.enabled", True) and version_at_least(chart.version.lstrip("v"), CHART_CLASS_MAPS_FROM):
        return CHART_CLASS_RESOURCE
    return None


# timeouts.helm's default. Helm's wait (`atomic` implies it: helm pkg/action/upgrade.go) lasts until every resource of
# the release is ready, a DaemonSet once its new pods are on every node (helm pkg/kube/ready.go daemonSetReady). The
# GPU Operator's release holds NFD's worker DaemonSet, on every node of the cluster: an upgrade that changes it rolls
# it over them maxUnavailable at a time, 1 (the Kubernetes default: NFD 0.17.3, in the GPU Operator module
# d73a0086a6ba, has no worker.updateStrategy; later NFD charts set 10%), some 20-30 s a node (old pod stopped, image
# pulled, readiness probe from 5 s). 7200 s covers about 250 nodes rolled one at a time, any cluster at 10%.
# pulumi-kubernetes' own default, 300 s (provider/pkg/provider/helm_release.go defaultTimeoutSeconds), would roll back
# an upgrade rolling more than ~10 nodes one at a time.
HELM_TIMEOUT = Timeouts.model_fields["helm"].default


def helm_release(
    resource_name: str, chart: HelmChart, values: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None,
    timeout: float = HELM_TIMEOUT,
) -> k8s.helm.v3.Release:
    """A pinned chart release; `atomic` rolls a failed upgrade back instead of leaving it half-applied, after `timeout`
    seconds (timeouts.helm) at the latest. `verify` (with `keyring`) makes Helm check the chart's provenance file before
    installing it (helm pkg/downloader VerifyChart)."""
    reference, repo = sources.chart_reference(chart.chart, chart.repo)  # an oci:// repo joins the chart reference
    return k8s.helm.v3.Release(
        resource_name,
        name=resource_name,
        chart=reference,
        version=chart.version,
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=repo) if repo else None,
        verify=chart.verify or None,  # unset unless asked: no diff for releases made before the option existed
        keyring=chart.keyring if chart.verify else None,
        namespace=chart.namespace,
        create_namespace=True,
        atomic=True,
        timeout=math.ceil(timeout),  # whole seconds (the provider's Release.Timeout is an int)
        values=values,
        opts=opts,
    )


def gpu_operator_release(chart: HelmChart, opts: Optional[pulumi.ResourceOptions] = None,
                         timeout: float = HELM_TIMEOUT) -> k8s.helm.v3.Release:
    """OPERATOR_DEFAULTS under the stack's values (they win)."""
    return helm_release("gpu-operator", chart, deep_merge(OPERATOR_DEFAULTS, chart.values), opts, timeout)


def dra_driver_release(
    chart: HelmChart, pilot_label: tuple[str, str], opts: Optional[pulumi.ResourceOptions] = None,
    tolerations: Optional[list[dict[str, str]]] = None, timeout: float = HELM_TIMEOUT,
) -> k8s.helm.v3.Release:
    """The kubelet plugin is pinned to pilot-labelled nodes, whatever the stack's values say."""
    values = dra_values(chart, pilot_label, tolerations or [])
    problems = dra_values_problems(values)
    if problems:
        raise ConfigError("invalid stack config:\n" + "\n".join(f"  gpu-migration:draDriver.values: {p}"
                                                                 for p in problems))
    return helm_release("dra-driver", chart, values, opts, timeout)
