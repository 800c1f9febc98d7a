"""Check pods the program runs (smoke test, rollback check): waiting for their end, re-creating and deleting them."""
from typing import Any, Optional

import pulumi
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..common.waiting import wait_for
from .cluster import TERMINAL
from .provider import _short, _timing
from .smoke_criteria import capture_claim


def _wait_for_pod_end(api, namespace: str, name: str, uid: Optional[str], props: dict[str, Any], default: float,
                      claims: Optional[dict[str, Any]] = None):
    """Wait until the pod Succeeded/Failed (or is unschedulable); return it. With `claims`, the pod's DRA
    extended-resource claim is read (once) while the pod still holds it: kube-controller-manager's resourceclaim
    controller deletes that claim as soon as the pod is done (kubernetes pkg/controller/resourceclaim/controller.go)."""
    def poll():
        try:
            pod = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return False, None, "pod not found"
            raise
        if uid and pod.metadata.uid != uid:
            return False, None, f"pod has uid {pod.metadata.uid}, expected {uid}"
        if claims is not None:
            capture_claim(api, pod, claims)
        phase = pod.status.phase if pod.status else None
        unschedulable = [c for c in (pod.status.conditions or []) if pod.status
                         if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"]
        stuck = stuck_containers(pod)
        state = (f"phase {phase}" + "".join(f", unschedulable: {c.message}" for c in unschedulable)
                 + "".join(f", {s}" for s in stuck))
        return phase in TERMINAL or bool(unschedulable) or bool(stuck), pod, state

    return wait_for(f"pod {namespace}/{name} to finish", poll, **_timing(props, default))


# Waiting reasons that do not clear up by themselves (kubernetes pkg/kubelet/images: ErrImagePull, ImagePullBackOff,
# ErrImageNeverPull, InvalidImageName; pkg/kubelet/kuberuntime: CreateContainerConfigError): reported at once.
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CreateContainerConfigError")


def stuck_containers(pod) -> list[str]:
    statuses = [*((pod.status.init_container_statuses or []) if pod.status else []),
                *((pod.status.container_statuses or []) if pod.status else [])]
    return [f"container {c.name} {c.state.waiting.reason}: {c.state.waiting.message or ''}".rstrip(": ")
            for c in statuses if c.state and c.state.waiting and c.state.waiting.reason in STUCK_REASONS]


def _recreate_pod(api, namespace: str, name: str) -> str:
    """Replace a finished pod by a fresh copy of its spec (same name); returns the new uid. A failed smoke test is
    re-run by the next `pulumi up` this way, without waiting for the Pod resource to change."""
    core = client.CoreV1Api(api)
    old = core.read_namespaced_pod(name, namespace)
    spec = api.sanitize_for_serialization(old.spec)
    spec.pop("nodeName", None)  # let the scheduler place (and DRA allocate for) the new pod
    meta = {k: v for k, v in api.sanitize_for_serialization(old.metadata).items()
            if k in ("name", "namespace", "labels", "annotations")}
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def gone():
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return True, None, "deleted"
            raise
        return False, None, "still terminating"

    wait_for(f"old pod {namespace}/{name} to be deleted", gone, timeout=120, interval=1)
    return core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                                                  "spec": spec}).metadata.uid


def _current_uid(api, namespace: str, name: str) -> Optional[str]:
    try:
        return client.CoreV1Api(api).read_namespaced_pod(name, namespace).metadata.uid
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _delete_pod_quietly(core, namespace: str, name: str) -> None:
    """Delete a check pod without letting a failure hide the error being raised (it is logged instead)."""
    try:
        core.delete_namespaced_pod(name, namespace)
    except Exception as e:  # noqa: BLE001
        if not (isinstance(e, ApiException) and e.status == 404):
            pulumi.log.warn(f"could not delete check pod {namespace}/{name}: {_short(e)}; delete it by hand "
                            f"(`kubectl delete pod -n {namespace} {name}`) or let the next `pulumi up` do it")
