"""Helm releases: the NVIDIA GPU Operator and the DRA driver."""
import copy
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from .config import HelmChart


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` wins; nested dicts are merged, not replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def helm_release(
    resource_name: str, chart: HelmChart, values: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None
) -> k8s.helm.v3.Release:
    """A pinned chart release; `atomic` rolls a failed upgrade back instead of leaving it half-applied."""
    return k8s.helm.v3.Release(
        resource_name,
        name=resource_name,
        chart=chart.chart,
        version=chart.version,
        # oci:// charts carry their registry in the chart reference.
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repo) if chart.repo else None,
        namespace=chart.namespace,
        create_namespace=True,
        atomic=True,
        values=values,
        opts=opts,
    )


def gpu_operator_release(chart: HelmChart, opts: Optional[pulumi.ResourceOptions] = None) -> k8s.helm.v3.Release:
    return helm_release("gpu-operator", chart, chart.values, opts)


def dra_driver_release(
    chart: HelmChart, pilot_label: tuple[str, str], opts: Optional[pulumi.ResourceOptions] = None
) -> k8s.helm.v3.Release:
    """The kubelet plugin is pinned to pilot-labelled nodes, whatever the stack's values say."""
    pinned = {"kubeletPlugin": {"nodeSelector": {pilot_label[0]: pilot_label[1]}}}
    return helm_release("dra-driver", chart, deep_merge(chart.values, pinned), opts)
