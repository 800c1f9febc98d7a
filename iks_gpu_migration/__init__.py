"""Migrates IKS GPU nodes from IBM-managed NVIDIA drivers to the GPU Operator, then to DRA-backed extended resources.

Rooms, from the ground up: common/ (versions, names, bounded waits), config/ and plan/ (pure), kube/ and iks/ (dynamic
resources acting on the cluster and on IKS), components/ (the Pulumi components and the declaration), cli/ (status,
recover), program.py (the entry). docs/design.md has the map.
"""
from . import sdk_workarounds, state_compat

state_compat.install()  # before any unpickling: stacks of earlier releases name their providers by old module paths
sdk_workarounds.widen_provider_host()  # only in the dynamic-provider host: 4 threads served the whole stack
sdk_workarounds.connect_provider_host_log()  # only there: its pulumi.log printed to stderr, each line twice in the CLI
