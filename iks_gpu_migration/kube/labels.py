"""Node labels this program sets.

- `ibm-managed` nodes (and nodes awaiting replacement) carry the runbook's two fence labels. The GPU Operator
  deletes every GPU state label, `nvidia.com/gpu.deploy.driver` included, from a node with
  `nvidia.com/gpu.deploy.operands=false` (NVIDIA/gpu-operator v25.10.1 controllers/state_manager.go,
  updateGPUStateLabels -> removeAllGPUStateLabels; `deploy.operands` itself is not in gpuStateLabels). So only
  `deploy.operands=false` is declared as a NodePatch (it stays, so `pulumi refresh` + `pulumi up` converge), and
  `deploy.driver=false` is set once by the NodeFence, which keeps no live state to drift from.
- Migrated nodes: the pilot label and `nvidia.com/gpu.deploy.device-plugin` are switched step by step by
  kube/switch.py NodePathSwitch, never in one patch (a GPU must never be offered on both paths).
"""
from typing import TYPE_CHECKING, Optional

import pulumi

if TYPE_CHECKING:
    import pulumi_kubernetes as k8s

OPERANDS_OFF = {"nvidia.com/gpu.deploy.operands": "false"}
IBM_MANAGED_LABELS = {**OPERANDS_OFF, "nvidia.com/gpu.deploy.driver": "false"}
DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
DEVICE_PLUGIN_OFF = {DEVICE_PLUGIN_LABEL: "false"}


def stage_labels(stage: str, pilot_label: tuple[str, str]) -> dict[str, str]:
    """Labels declared (NodePatch) for a stage; migrated stages get theirs from NodePathSwitch."""
    if stage == "ibm-managed":
        return dict(OPERANDS_OFF)
    if stage in ("dra", "device-plugin"):
        return {}
    raise ValueError(f"unknown stage {stage!r}")


def node_patch(
    resource_name: str,
    node_name: pulumi.Input[str],
    labels: dict[str, str],
    opts: Optional[pulumi.ResourceOptions] = None,
) -> "k8s.core.v1.NodePatch":
    # Imported here: the dynamic-provider host imports this module for its label names (kube/switch.py) and has no
    # use for pulumi_kubernetes (about 0.4 s of its start, paid by every preview and up).
    import pulumi_kubernetes as k8s
    return k8s.core.v1.NodePatch(
        resource_name,
        metadata=k8s.meta.v1.ObjectMetaPatchArgs(
            name=node_name,
            labels=labels,
            # Take over labels the GPU Operator set.
            annotations={"pulumi.com/patchForce": "true"},
        ),
        opts=opts,
    )
