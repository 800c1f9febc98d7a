"""Smoke-test Pods: one per `dra` node, requesting one extended resource through the pilot path."""
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from ..common.names import smoke_pod_name
from ..config import SmokeTest
from ..kube import pod_security

UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}


def smoke_namespace(smoke: SmokeTest, opts: Optional[pulumi.ResourceOptions] = None) -> k8s.core.v1.Namespace:
    """Enforces Pod Security `restricted`: the smoke and rollback-check pods meet it (kube/pod_security.py), and
    nothing else belongs here."""
    return k8s.core.v1.Namespace(
        "smoke-namespace",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=smoke.namespace, labels=dict(pod_security.NAMESPACE_LABELS)),
        opts=opts,
    )


def _pod_security() -> dict:
    """kube/pod_security.py's settings as the provider's input types."""
    pod = pod_security.pod_spec_fields()
    context, container = pod["securityContext"], pod_security.container_security_context()
    return {
        "automount_service_account_token": pod["automountServiceAccountToken"],
        "security_context": k8s.core.v1.PodSecurityContextArgs(
            run_as_non_root=context["runAsNonRoot"], run_as_user=context["runAsUser"],
            run_as_group=context["runAsGroup"],
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type=context["seccompProfile"]["type"])),
        "container": k8s.core.v1.SecurityContextArgs(
            allow_privilege_escalation=container["allowPrivilegeEscalation"],
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=container["capabilities"]["drop"])),
    }


def smoke_pod(
    node_name: str,
    hostname: pulumi.Input[str],
    smoke: SmokeTest,
    extended_resource_name: str,
    pilot_label: tuple[str, str],
    opts: Optional[pulumi.ResourceOptions] = None,
    tolerations: Optional[list[dict[str, str]]] = None,
) -> k8s.core.v1.Pod:
    """The node stays cordoned (NodePathSwitch) until this pod passed, so it tolerates the cordon, and the GPU nodes'
    own taints (gpu-migration:gpuTaints)."""
    one_gpu = {extended_resource_name: "1"}
    tolerate = [UNSCHEDULABLE, *(tolerations or [])]
    security = _pod_security()
    return k8s.core.v1.Pod(
        f"smoke-{node_name}",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=smoke_pod_name(node_name),
            namespace=smoke.namespace,
            labels={"app.kubernetes.io/name": "gpu-smoke-test"},
            # The pod runs to completion; SmokeTestVerification does the waiting and judging, so the create waits only
            # for the object (its uid). Not `pulumi.com/skipAwait`: on a Pod that also skips waiting for the delete
            # (pulumi-kubernetes metadata/overrides.go allowsSkipAwaitWithDelete, issues #1232 and #3154), and a
            # replacement's server-side apply then met the old, still terminating pod: field conflict on
            # .spec.nodeSelector and .spec.tolerations (tests/real/test_engine_minimal.py).
            annotations={"pulumi.com/waitFor": "jsonpath={.metadata.uid}"},
        ),
        spec=k8s.core.v1.PodSpecArgs(
            restart_policy="Never",
            automount_service_account_token=security["automount_service_account_token"],
            security_context=security["security_context"],
            node_selector={"kubernetes.io/hostname": hostname, pilot_label[0]: pilot_label[1]},
            tolerations=[k8s.core.v1.TolerationArgs(**t) for t in tolerate],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="smoke",
                    image=smoke.image,
                    command=smoke.command,
                    resources=k8s.core.v1.ResourceRequirementsArgs(requests=one_gpu, limits=one_gpu),
                    security_context=security["container"],
                )
            ],
        ),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True)),
    )
