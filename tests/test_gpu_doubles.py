"""The GPU doubles of the local environment report the GPU of the node's IKS flavor (gpu_migration_local/gpu_doubles.py)."""
import pytest

from gpu_migration_local.gpu_doubles import gpu_model


@pytest.mark.parametrize("flavor, name, memory", [
    ("gx3.16x80.l4", "NVIDIA L4", "24Gi"),
    ("gx3.24x120.l40s", "NVIDIA L40S", "48Gi"),
    ("gx3d.160x1792.8h100", "NVIDIA H100 80GB HBM3", "80Gi"),
    ("gx2.8x64.1v100", "Tesla V100-PCIE-16GB", "16Gi"),
    ("", "NVIDIA L4", "24Gi"),  # no flavor label: the local workers' L4
])
def test_gpu_of_each_flavor(flavor, name, memory):
    model = gpu_model(flavor)
    assert (model.name, model.memory) == (name, memory)
