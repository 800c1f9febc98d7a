"""The local environment of gpu-migration: the real tools (Pulumi CLI, Kubernetes provider, a Kubernetes control
plane) built from Go modules, doubles for what can't run here (IKS, NVIDIA operands, GPUs), and the local demo."""
