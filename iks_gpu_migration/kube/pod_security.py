"""What every pod the program runs (the smoke test, the rollback check) gets, so they pass Pod Security "restricted",
and the labels that make the smoke namespace enforce that level.

Restricted (kubernetes.io/docs/concepts/security/pod-security-standards; checked by the API server's PodSecurity
admission, k8s.io/pod-security-admission policy/check_*.go) asks for: allowPrivilegeEscalation false, capabilities
drop ALL, runAsNonRoot true with no runAsUser 0, seccompProfile RuntimeDefault (or Localhost), and only
non-host volume types (these pods have none; without a service account token they get no projected volume either).

runAsUser: the CUDA base images (nvcr.io/nvidia/cuda:*-base-*) set no USER, so they run as root, and runAsNonRoot
alone would make the kubelet refuse to start them ("image will run as root": kubelet kuberuntime verifyRunAsNonRoot).
The checks run `nvidia-smi`, which needs no root: the NVIDIA driver creates its device files with mode 0666 unless
NVreg_DeviceFileMode says otherwise (open-gpu-kernel-modules kernel-open/nvidia/nv-reg.h, "The default mode is
0666"), and the container toolkit / DRA driver inject them into the container with that mode. 65534 is `nobody`,
present in the UBI and Ubuntu base images. A custom smokeTest.command that needs root fails criterion 4 and names
the pod; run it under an image that sets its own non-root USER instead.
"""
from typing import Any

LEVEL = "restricted"
NON_ROOT = 65534  # nobody

# enforce refuses a pod that breaks the level; audit and warn say why in the audit log and to the client.
NAMESPACE_LABELS = {f"pod-security.kubernetes.io/{mode}": LEVEL for mode in ("enforce", "audit", "warn")}


def pod_spec_fields() -> dict[str, Any]:
    """Pod-level fields (camelCase, as in the API): no service account token, non-root, RuntimeDefault seccomp."""
    return {
        # The checks never call the API server: a mounted token would only be something to steal.
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": NON_ROOT, "runAsGroup": NON_ROOT,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }


def container_security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
