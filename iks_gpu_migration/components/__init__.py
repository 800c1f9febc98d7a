"""The Pulumi components: one GPU node, the GPU Operator, the DRA path, the rollout in batches, and the declaration
that orders them (migration.py: declare)."""
