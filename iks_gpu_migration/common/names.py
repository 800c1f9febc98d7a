"""Names of the Kubernetes objects this program derives from a node name, and the limits they must fit.

Kept apart so the config check (config/) and the code that creates the objects (components/smoke_pod.py, kube/)
share one definition: a node name that makes any of them invalid is rejected before anything is declared.
"""

# apimachinery validation: a label value is <= 63 chars (IsValidLabelValue), an object name that is a DNS subdomain
# <= 253 (IsDNS1123Subdomain). Source: kubernetes/apimachinery pkg/util/validation/validation.go.
LABEL_VALUE_MAX = 63
DNS_SUBDOMAIN_MAX = 253
# The API server validates a pod's nodeSelector as labels (ValidatePodSpec -> ValidateLabels in
# kubernetes/kubernetes pkg/apis/core/validation/validation.go), so the node name used as the value of
# kubernetes.io/hostname must be a valid label value.
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Release 0.2.0 named the smoke pod gpu-smoke-<node>. Its Pod Security settings (kube/pod_security.py) can't change
# in place, so an upgraded stack replaces the pod; a replacement under the same name breaks `pulumi preview`: the
# Kubernetes provider previews the new pod with a server-side dry-run apply, which meets the old pod and is answered
# 422 Invalid ("pod updates may not change fields"), and its preview tolerates only Forbidden and AlreadyExists
# (pulumi-kubernetes provider/pkg/provider/provider.go Create). Under a new name the preview sees no old pod.
SMOKE_POD_PREFIX = "gpu-smoke-test-"
ROLLBACK_POD_PREFIX = "gpu-rollback-check-"


def smoke_pod_name(node_name: str) -> str:
    return f"{SMOKE_POD_PREFIX}{node_name}"


def rollback_pod_generate_name(node_name: str) -> str:
    # generateName gets 5 random chars appended and is truncated by the server to fit; keep it a valid prefix.
    return f"{ROLLBACK_POD_PREFIX}{node_name}-"[:58]


def node_name_problems(node_name: str) -> list[str]:
    """Why objects derived from `node_name` could not be created; [] if they all fit."""
    problems = []
    if len(node_name) > LABEL_VALUE_MAX:
        problems.append(f"is {len(node_name)} chars, but pods select it as {HOSTNAME_LABEL}=<name>, a label value of "
                        f"at most {LABEL_VALUE_MAX}")
    pod = smoke_pod_name(node_name)
    if len(pod) > DNS_SUBDOMAIN_MAX:
        problems.append(f"makes the smoke pod name {pod[:40]}... {len(pod)} chars (at most {DNS_SUBDOMAIN_MAX})")
    return problems
