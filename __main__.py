"""gpu-migration: moves IKS GPU nodes ibm-managed -> device-plugin (GPU Operator) -> dra, per stack config."""
from iks_gpu_migration.program import main

main()
