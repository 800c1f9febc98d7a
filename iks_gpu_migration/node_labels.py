"""Per-stage node labels, applied with server-side-apply NodePatch.

The same GPU must never be offered by both paths, so a `dra` node turns the operator's device plugin off.
Labels this program owns and no longer lists are removed by server-side apply (e.g. on rollback).
"""
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

IBM_MANAGED_LABELS = {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}
DEVICE_PLUGIN_OFF = {"nvidia.com/gpu.deploy.device-plugin": "false"}


def stage_labels(stage: str, pilot_label: tuple[str, str]) -> dict[str, str]:
    if stage == "ibm-managed":
        return dict(IBM_MANAGED_LABELS)
    if stage == "dra":
        return {pilot_label[0]: pilot_label[1], **DEVICE_PLUGIN_OFF}
    if stage == "device-plugin":
        return {}
    raise ValueError(f"unknown stage {stage!r}")


def node_patch(
    resource_name: str,
    node_name: pulumi.Input[str],
    labels: dict[str, str],
    opts: Optional[pulumi.ResourceOptions] = None,
) -> k8s.core.v1.NodePatch:
    return k8s.core.v1.NodePatch(
        resource_name,
        metadata=k8s.meta.v1.ObjectMetaPatchArgs(
            name=node_name,
            labels=labels,
            # Take over labels the GPU Operator set (e.g. gpu.deploy.device-plugin=true).
            annotations={"pulumi.com/patchForce": "true"},
        ),
        opts=opts,
    )
