"""The rollback check (dra -> device-plugin): after the path switch, a check pod proves the device plugin serves the
node's GPU, then the node is uncordoned (verify_rollback, run by kube/switch.py NodePathSwitch). NodeDrain is the
superseded rollback drain, kept for stacks that hold one."""
import math
from typing import Any, Optional, Sequence

import pulumi
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import Resource

from ..common import names
from ..common.waiting import WaitTimeout, wait_for
from . import cluster, pod_security
from .cordon import CORDON_ANNOTATION, UNSCHEDULABLE_TAINT, _set_unschedulable
from .pods import _delete_pod_quietly, _wait_for_pod_end
from .provider import CheckFailed, _bullets, _Provider, _short, _timing
from .records import _record


ROLLBACK_COMMAND = ["sh", "-c", "nvidia-smi -L"]


ROLLBACK_APP = "gpu-rollback-check"


ROLLBACK_NODE_LABEL = "migration.example.com/rollback-node"  # finds a check pod left by an interrupted run


# NodeDrain is superseded by kube/switch.py NodePathSwitch; kept so stacks that still hold one can delete it (dynamic
# providers are loaded from state by module path and class name).
class _NodeDrainProvider(_Provider):
    rerun_on = ("node", "pilot_label", "extended_resource")

    def run(self, api, p):
        node = p["node"]
        key, _, value = p["pilot_label"].partition("=")
        labels = client.CoreV1Api(api).read_node(node).metadata.labels or {}
        if labels.get(key) != value:
            return {"rolling_back": False}
        pulumi.log.info(f"node {node} still has {key}={value}: rolling back from dra, cordoning it")
        _set_unschedulable(api, node, True)

        def poll():
            pods = cluster.gpu_pods(api, node, p["extended_resource"])
            return not pods, pods, f"GPU pods still running: {', '.join(pods)}"

        left = (f"node {node} is left cordoned with its labels unchanged; run `pulumi up` again to continue the "
                f"rollback (or `kubectl uncordon {node}` to stay on dra and set its stage back to dra)")
        try:
            wait_for(f"GPU pods on node {node} to finish", poll, **_timing(p, 1800))
        except WaitTimeout as e:
            raise CheckFailed(f"{e}\n{left}; let those pods finish (or move them) first") from None
        except Exception as e:  # an API error mid-wait: the node is cordoned all the same
            raise CheckFailed(f"reading the GPU pods on node {node} failed while waiting for them to finish: "
                              f"{_short(e)}\n{left}") from e
        return {"rolling_back": True}


class NodeDrain(Resource, module="gpu-migration", name="NodeDrain"):
    """For a device-plugin node still carrying the pilot label: cordon, wait for its GPU pods to finish."""

    rolling_back: pulumi.Output[bool]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        node: pulumi.Input[str],
        pilot_label: pulumi.Input[str],  # key=value
        extended_resource: pulumi.Input[str],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, node=node, pilot_label=pilot_label, extended_resource=extended_resource,
                     timeout=timeout, poll_interval=poll_interval, rolling_back=None)
        super().__init__(_NodeDrainProvider(), name, props, opts)


def rollback_selector(node: str) -> str:
    return f"app.kubernetes.io/name={ROLLBACK_APP},{ROLLBACK_NODE_LABEL}={node}"


def rollback_pod(node: str, extended_resource: str, image: str, command: list[str],
                 deadline: Optional[float] = None, tolerations: Sequence[dict] = ()) -> dict[str, Any]:
    one = {extended_resource: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": names.rollback_pod_generate_name(node),
                     "labels": {"app.kubernetes.io/name": ROLLBACK_APP, ROLLBACK_NODE_LABEL: node}},
        "spec": {
            "restartPolicy": "Never",
            **pod_security.pod_spec_fields(),  # Pod Security restricted, as the smoke pod
            # If the process is killed before it can delete the pod, the pod still stops and frees its GPU
            # (the next run deletes it).
            **({"activeDeadlineSeconds": max(1, math.ceil(deadline))} if deadline else {}),
            "nodeSelector": {"kubernetes.io/hostname": node},
            # The node is cordoned until this pod passes.
            "tolerations": [{"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
                            *tolerations],
            "containers": [{"name": "smoke", "image": image, "command": command,
                            "resources": {"requests": one, "limits": one},
                            "securityContext": pod_security.container_security_context()}],
        },
    }


def rollback_problems(api, pod, node: str) -> tuple[list[str], str]:
    """The device-plugin smoke pod ran on the node, not through DRA, succeeded and logged a GPU UUID."""
    name = f"{pod.metadata.namespace}/{pod.metadata.name}"
    problems = []
    if pod.spec.node_name != node:
        problems.append(f"pod {name} ran on node {pod.spec.node_name!r}, expected {node!r}")
    if pod.status.extended_resource_claim_status:
        problems.append(f"pod {name} got its GPU through DRA (extendedResourceClaimStatus set), not the device plugin")
    if pod.status.phase != "Succeeded":
        problems.append(f"pod {name} phase {pod.status.phase}")
    log = cluster.pod_log(api, pod)
    uuids = cluster.logged_uuids(log)
    if not uuids:
        problems.append(f"pod {name} logs name no GPU UUID; logs: {log[-300:]!r}")
    return problems, ",".join(uuids)


def verify_rollback(api, p: dict[str, Any]) -> dict[str, str]:
    """After a switch back to the device plugin (`rolling_back`): device-plugin GPUs allocatable, a check pod passes,
    the node uncordoned and the result recorded on it. `p`: node, rolling_back, extended_resource (the device plugin's
    resource), image, namespace, command, tolerations, timeout, poll_interval."""
    if not p.get("rolling_back"):
        return {"gpu_uuid": "", "result": "not rolling back"}
    node = p["node"]
    try:
        gpu_uuid = _run_check_pod(api, p)
    except (CheckFailed, WaitTimeout) as e:
        note = _record(api, node, {"path": "device-plugin", "result": "failed", "problems": [str(e)]})
        raise CheckFailed(
            f"rollback of node {node} to the device plugin failed: {e}\n"
            f"node {node} is left cordoned; fix the cause and run `pulumi up` again "
            f"(or `kubectl uncordon {node}` to accept it as is)" + (f"\n{note}" if note else "")
        ) from None
    try:
        _set_unschedulable(api, node, False)
        client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {CORDON_ANNOTATION: None}}})
    except Exception as e:
        raise CheckFailed(f"rollback of node {node} to the device plugin passed (GPU {gpu_uuid}), but uncordoning "
                          f"it failed: {_short(e)}\nrun `kubectl uncordon {node}` or `pulumi up` again") from e
    _record(api, node, {"path": "device-plugin", "result": "passed", "gpu": gpu_uuid})
    return {"gpu_uuid": gpu_uuid, "result": f"passed: device-plugin GPU {gpu_uuid}; node {node} uncordoned"}


class _RollbackVerificationProvider(_Provider):
    """Retired as a resource of its own: the path switch runs verify_rollback (kube/switch.py NodePathSwitch). Kept so
    the next `up` of a stack deployed before can delete its `<node>-rollback` (the pickled provider names this
    class)."""
    rerun_on = ("node", "rolling_back", "extended_resource", "image", "namespace", "command")

    def run(self, api, p):
        return verify_rollback(api, p)


def _run_check_pod(api, p: dict[str, Any]) -> str:
    """The check pod on the device-plugin path: the GPU UUID it printed, or CheckFailed."""
    core, node, ns, resource = client.CoreV1Api(api), p["node"], p["namespace"], p["extended_resource"]

    def allocatable():
        count = cluster.allocatable(core.read_node(node), resource)
        return count > 0, count, f"{resource} allocatable {count}"

    wait_for(f"device plugin to offer {resource} on node {node}", allocatable, **_timing(p, 600))
    try:
        # Labelled as the smoke namespace the DRA path declares (components/smoke_pod.py).
        core.create_namespace({"metadata": {"name": ns, "labels": dict(pod_security.NAMESPACE_LABELS)}})
    except ApiException as e:
        if e.status not in (403, 409):  # exists, or we may not create namespaces (then the pod create says so)
            raise
    _delete_rollback_pods(core, ns, node)  # left by an earlier run that was killed
    timing = _timing(p, 600)
    body = rollback_pod(node, resource, p["image"], p.get("command") or ROLLBACK_COMMAND, timing["timeout"],
                        p.get("tolerations") or [])
    name = core.create_namespaced_pod(ns, body).metadata.name
    try:
        pod = _wait_for_pod_end(api, ns, name, None, p, 600)
        problems, gpu_uuid = rollback_problems(api, pod, node)
    except BaseException:  # failure, KeyboardInterrupt or shutdown: delete the pod, keep the original error
        _delete_pod_quietly(core, ns, name)
        raise
    _delete_pod_quietly(core, ns, name)
    if problems:
        raise CheckFailed(_bullets(problems))
    return gpu_uuid


def _delete_rollback_pods(core, namespace: str, node: str) -> None:
    for pod in core.list_namespaced_pod(namespace, label_selector=rollback_selector(node)).items:
        pulumi.log.info(f"deleting check pod {namespace}/{pod.metadata.name} left by an interrupted run")
        _delete_pod_quietly(core, namespace, pod.metadata.name)
