"""Dynamic resources that check and act on the live cluster with the official kubernetes client.

Each provider builds its ApiClient per call from `kubeconfig` (None: KUBECONFIG or ~/.kube/config): providers are
dill-serialized into the state (by reference to this module), so they hold no clients. Every wait is bounded
(iks_gpu_migration.waiting.wait_for); a failed check fails `up` with a message naming the node, pod or device, and the next
`up` retries it.
"""
import json
import math
import time
from datetime import datetime, timezone
from typing import Any, Optional, Sequence

import pulumi
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from . import kube_checks, names
from .versions import version_at_least
from .waiting import Interrupted, WaitTimeout, optional_float, wait_for  # noqa: F401 (Interrupted re-exported)

VERIFICATION_ANNOTATION = "migration.example.com/gpu-verification"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
CORDON_ANNOTATION = "migration.example.com/cordoned-for"  # see node_switch
ROLLBACK_COMMAND = ["sh", "-c", "nvidia-smi -L"]
ROLLBACK_APP = "gpu-rollback-check"
ROLLBACK_NODE_LABEL = "migration.example.com/rollback-node"  # finds a check pod left by an interrupted run


class CheckFailed(Exception):
    """A cluster check did not pass; the message lists what was seen."""


def _client(kubeconfig: Optional[str]):
    return config.new_client_from_config(config_file=kubeconfig or None)


def _bullets(problems: Sequence[str]) -> str:
    return "".join(f"\n  - {p}" for p in problems)


def _record(api, node: str, record: dict[str, Any]) -> str:
    """Store the last verification on the node, for `python -m iks_gpu_migration.status`.

    Never raises: failing to record must not replace the verification's own result. Returns "" or a sentence to
    append to that result's message."""
    record = {**record, "checkedAt": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    body = {"metadata": {"annotations": {VERIFICATION_ANNOTATION: json.dumps(record, sort_keys=True)}}}
    try:
        client.CoreV1Api(api).patch_node(node, body)
    except Exception as e:  # noqa: BLE001 - any failure here is secondary to the verification
        note = (f"(the result could not be recorded on node {node} as {VERIFICATION_ANNOTATION}: {_short(e)}; "
                f"`python -m iks_gpu_migration.status` shows an older verification)")
        pulumi.log.warn(note)
        return note
    return ""


def _short(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason}"
    return " ".join(str(error).split())[:200] or type(error).__name__


def _set_unschedulable(api, node: str, unschedulable: bool) -> None:
    client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": unschedulable or None}})


class _Provider(ResourceProvider):
    """create() runs the check; a change of any input in `rerun_on` replaces the resource (runs it again)."""

    rerun_on: tuple[str, ...] = ()

    def run(self, api, props: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def create(self, props: dict[str, Any]) -> CreateResult:
        with _client(props.get("kubeconfig")) as api:
            outs = self.run(api, props)
        return CreateResult(id_=f"{type(self).__name__}-{time.time_ns()}", outs={**props, **outs})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in self.rerun_on if olds.get(k) != news.get(k)]
        changed = replaces or [k for k in news if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs={**olds, **news})  # only timeouts/kubeconfig changed: nothing to re-run

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        pass  # checks leave nothing behind


def _timing(props: dict[str, Any], timeout: float) -> dict[str, float]:
    return {"timeout": optional_float(props.get("timeout"), timeout),
            "interval": optional_float(props.get("poll_interval"), 15)}


def _wait_until_no_problems(what: str, check, props: dict[str, Any], default_timeout: float) -> None:
    def poll():
        problems = check()
        return not problems, problems, "; ".join(problems)

    timing = _timing(props, default_timeout)
    try:
        wait_for(what, poll, **timing)
    except WaitTimeout:
        raise CheckFailed(f"{what} did not pass within {timing['timeout']:.0f}s:{_bullets(check())}") from None


# --- DRA preflight ---------------------------------------------------------------------------------------------


class _DraPreflightProvider(_Provider):
    rerun_on = ("driver", "extended_resource", "dra_nodes", "all_nodes", "device_plugin_resource", "device_class",
                "pilot_label")

    def run(self, api, p):
        check = lambda: kube_checks.preflight(api, p["driver"], p["extended_resource"], p["dra_nodes"], p["all_nodes"],
                                              p.get("device_plugin_resource") or kube_checks.GPU_RESOURCE,
                                              p.get("device_class"), p.get("pilot_label"))
        _wait_until_no_problems(f"DRA preflight for driver {p['driver']}", check, p, 1800)
        return {"checked_nodes": sorted(p["dra_nodes"])}


class DraPreflight(Resource, module="gpu-migration", name="DraPreflight"):
    """Waits until DRA extended resources are served and driver slices exist exactly on the dra nodes."""

    checked_nodes: pulumi.Output[list[str]]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        driver: pulumi.Input[str],
        extended_resource: pulumi.Input[str],
        dra_nodes: pulumi.Input[Sequence[pulumi.Input[str]]],
        all_nodes: pulumi.Input[Sequence[pulumi.Input[str]]],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        device_plugin_resource: pulumi.Input[Optional[str]] = None,  # also checked for double offering
        device_class: pulumi.Input[Optional[str]] = None,  # the one class that may map extended_resource
        pilot_label: Optional[str] = None,  # the nodes are one batch's (kube_checks.preflight)
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, driver=driver, extended_resource=extended_resource, dra_nodes=dra_nodes,
                     all_nodes=all_nodes, device_plugin_resource=device_plugin_resource, device_class=device_class,
                     pilot_label=pilot_label, timeout=timeout, poll_interval=poll_interval, checked_nodes=None)
        super().__init__(_DraPreflightProvider(), name, props, opts)


# --- Smoke-test verification -------------------------------------------------------------------------------------


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
            kube_checks.capture_claim(api, pod, claims)
        phase = pod.status.phase if pod.status else None
        unschedulable = [c for c in (pod.status.conditions or []) if pod.status
                         if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"]
        stuck = stuck_containers(pod)
        state = (f"phase {phase}" + "".join(f", unschedulable: {c.message}" for c in unschedulable)
                 + "".join(f", {s}" for s in stuck))
        return phase in kube_checks.TERMINAL or bool(unschedulable) or bool(stuck), pod, state

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


def _last_record(api, node: str) -> dict[str, Any]:
    raw = (client.CoreV1Api(api).read_node(node).metadata.annotations or {}).get(VERIFICATION_ANNOTATION)
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}


class _SmokeTestVerificationProvider(_Provider):
    rerun_on = ("namespace", "pod_name", "pod_uid", "node", "driver", "extended_resource")

    def run(self, api, p):
        node, pod = p["node"], f"{p['namespace']}/{p['pod_name']}"
        uid = p.get("pod_uid")
        last, current = _last_record(api, node), _current_uid(api, p["namespace"], p["pod_name"])
        if current and last.get("pod") == pod and last.get("podUid") == current:
            # The pod judged by an earlier `up` (the Pod resource's, or one this provider re-created).
            uid = current
            if last.get("result") == "failed":
                pulumi.log.info(f"node {node}: smoke pod {pod} failed before; replacing it to run the test again")
                uid = _recreate_pod(api, p["namespace"], p["pod_name"])
        try:
            claims: dict[str, Any] = {}
            ended = _wait_for_pod_end(api, p["namespace"], p["pod_name"], uid, p, 600, claims)
            stuck = stuck_containers(ended)
            if stuck:
                result = kube_checks.SmokeResult(problems=[f"criterion 4 (GPU operation): pod {pod} {s}"
                                                           for s in stuck])
            else:
                result = kube_checks.verify_smoke(api, p["namespace"], p["pod_name"], node, p["driver"],
                                                  p["extended_resource"], p.get("dra_namespace"), claims)
        except WaitTimeout as e:
            result = kube_checks.SmokeResult(problems=[f"criterion 4 (GPU operation): {e}"])
        passed = not result.problems
        note = _record(api, node, {"path": "dra", "result": "passed" if passed else "failed", "pod": pod,
                                   "podUid": uid, "gpu": result.gpu_uuid, "device": result.device,
                                   "problems": result.problems})
        if not passed:
            # The next `up` knows this pod failed only from the record; without it, it would judge the pod again.
            rerun = ("it replaces the pod and judges the new one" if not note else
                     f"as the result was not recorded, replace the pod yourself: `pulumi up --replace <URN of "
                     f"smoke-{p['pod_name'].removeprefix(names.SMOKE_POD_PREFIX)}>`")
            raise CheckFailed(
                f"smoke test {pod} on node {node} failed:{_bullets(result.problems)}\n"
                f"node {node} stays cordoned. Fix the cause and run `pulumi up` again: {rerun}"
                + (f"\n{note}" if note else "")
            )
        summary = f"passed: {pod} used {result.device} ({result.gpu_uuid}) via {result.claim}"
        try:
            if _uncordon_if_ours(api, node):
                summary += f"; node {node} uncordoned"
        except Exception as e:
            raise CheckFailed(
                f"smoke test {summary}, but uncordoning node {node} failed: {_short(e)}\n"
                f"run `pulumi up` again (it judges the same pod again) or `kubectl uncordon {node}`") from e
        pulumi.log.info(f"node {node}: smoke test {summary}")
        return {"gpu_uuid": result.gpu_uuid, "device": result.device, "claim": result.claim, "result": summary}


def _uncordon_if_ours(api, node: str) -> bool:
    from .node_switch import uncordon_if_ours  # noqa: PLC0415 (node_switch imports this module)
    return uncordon_if_ours(api, node)


class SmokeTestVerification(Resource, module="gpu-migration", name="SmokeTestVerification"):
    """Judges the node's smoke-test Pod by the four criteria; re-runs when the Pod is replaced (new uid)."""

    gpu_uuid: pulumi.Output[str]
    device: pulumi.Output[str]  # <driver>/<pool>/<device>
    claim: pulumi.Output[str]  # namespace/name of the ResourceClaim generated for the Pod
    result: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        namespace: pulumi.Input[str],
        pod_name: pulumi.Input[str],
        pod_uid: pulumi.Input[str],
        node: pulumi.Input[str],
        driver: pulumi.Input[str],
        extended_resource: pulumi.Input[str],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        dra_namespace: pulumi.Input[Optional[str]] = None,  # criterion 2 reads the DRA kubelet plugin's log there
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, namespace=namespace, pod_name=pod_name, pod_uid=pod_uid, node=node,
                     driver=driver, extended_resource=extended_resource, dra_namespace=dra_namespace, timeout=timeout,
                     poll_interval=poll_interval, gpu_uuid=None, device=None, claim=None, result=None)
        super().__init__(_SmokeTestVerificationProvider(), name, props, opts)


# --- GPU Operator readiness ------------------------------------------------------------------------------------------


class _OperatorReadinessProvider(_Provider):
    rerun_on = ("node", "stage", "namespace", "driver", "device_plugin_resource", "dra_namespace")

    def run(self, api, p):
        if p.get("config_name"):  # lets GpuNodeInventory tie a replaced node (new name) to its config entry
            body = {"metadata": {"annotations": {kube_checks.CONFIG_NAME_ANNOTATION: p["config_name"]}}}
            client.CoreV1Api(api).patch_node(p["node"], body)
        resource = p.get("device_plugin_resource") or kube_checks.GPU_RESOURCE
        check = lambda: kube_checks.operator_ready(api, p["node"], p["namespace"], p["stage"], p.get("driver"), resource,
                                                   p.get("dra_namespace"))
        _wait_until_no_problems(f"GPU Operator on node {p['node']} ({p['stage']})", check, p, 1800)
        return {"ready": True}


class OperatorReadiness(Resource, module="gpu-migration", name="OperatorReadiness"):
    """Waits until the node's operand pods run/completed and its GPUs are allocatable on the stage's path."""

    ready: pulumi.Output[bool]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        node: pulumi.Input[str],
        stage: pulumi.Input[str],
        namespace: pulumi.Input[str],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        driver: pulumi.Input[Optional[str]] = None,  # dra stage: count only this driver's devices
        device_plugin_resource: pulumi.Input[Optional[str]] = None,  # device-plugin stage: default nvidia.com/gpu
        dra_namespace: pulumi.Input[Optional[str]] = None,  # dra stage: the DRA kubelet plugin pod must be Ready
        config_name: Optional[str] = None,  # the node's name in gpu-migration:nodes, recorded on the node
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, node=node, stage=stage, namespace=namespace, driver=driver,
                     device_plugin_resource=device_plugin_resource, dra_namespace=dra_namespace,
                     config_name=config_name, timeout=timeout,
                     poll_interval=poll_interval, ready=None)
        super().__init__(_OperatorReadinessProvider(), name, props, opts)


# --- Fence for nodes still on IBM-managed drivers -----------------------------------------------------------------


class _NodeFenceProvider(_Provider):
    rerun_on = ("node", "labels", "operator_min_version", "stage")

    def run(self, api, p):
        """Label the node so the GPU Operator skips it while its kubelet predates `operator_min_version`.

        For an `ibm-managed` node (stage given) the node must exist and still run IBM's drivers: a worker already
        replaced at >= operator_min_version has no IBM drivers, and fencing it would take its GPUs away."""
        core, node, ibm_managed = client.CoreV1Api(api), p["node"], p.get("stage") == "ibm-managed"
        try:
            info = core.read_node(node).status.node_info
        except ApiException as e:
            if e.status == 404:
                if ibm_managed:
                    raise CheckFailed(f"node {node} (stage ibm-managed in gpu-migration:nodes) matches no node in "
                                      "the cluster; fix its name (`kubectl get nodes`)") from None
                return {"fenced": False}  # already replaced under another name
            raise
        kubelet = info.kubelet_version if info else None
        if kubelet and version_at_least(kubelet, p["operator_min_version"]):
            if ibm_managed:
                raise CheckFailed(
                    f"node {node} is set to stage ibm-managed but runs kubelet {kubelet}: its worker was already "
                    f"replaced and has no IBM-managed drivers; going back to ibm-managed is not supported. Set its "
                    f"stage to device-plugin (or dra)")
            return {"fenced": False}
        pulumi.log.info(f"node {node} runs kubelet {kubelet} (IBM-managed drivers): fencing it off the GPU Operator "
                        f"until its worker is replaced")
        core.patch_node(node, {"metadata": {"labels": p["labels"]}})
        return {"fenced": True}


class NodeFence(Resource, module="gpu-migration", name="NodeFence"):
    """Before the GPU Operator is installed: fence a node whose worker is not replaced yet (the replacement is a new
    Node object without these labels, so nothing has to remove them)."""

    fenced: pulumi.Output[bool]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        node: pulumi.Input[str],
        labels: pulumi.Input[dict],
        operator_min_version: pulumi.Input[str],
        stage: Optional[str] = None,  # "ibm-managed": the node must exist and still run IBM's drivers
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, node=node, labels=labels, operator_min_version=operator_min_version,
                     stage=stage, fenced=None)
        super().__init__(_NodeFenceProvider(), name, props, opts)


# --- Rollback (dra -> device-plugin) ---------------------------------------------------------------------------------


# NodeDrain is superseded by node_switch.NodePathSwitch; kept so stacks that still hold one can delete it (dynamic
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
            pods = kube_checks.gpu_pods(api, node, p["extended_resource"])
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
            # If the process is killed before it can delete the pod, the pod still stops and frees its GPU
            # (the next run deletes it).
            **({"activeDeadlineSeconds": max(1, math.ceil(deadline))} if deadline else {}),
            "nodeSelector": {"kubernetes.io/hostname": node},
            # The node is cordoned until this pod passes.
            "tolerations": [{"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
                            *tolerations],
            "containers": [{"name": "smoke", "image": image, "command": command,
                            "resources": {"requests": one, "limits": one}}],
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
    log = kube_checks.pod_log(api, pod)
    uuids = kube_checks.logged_uuids(log)
    if not uuids:
        problems.append(f"pod {name} logs name no GPU UUID; logs: {log[-300:]!r}")
    return problems, ",".join(uuids)


class _RollbackVerificationProvider(_Provider):
    rerun_on = ("node", "rolling_back", "extended_resource", "image", "namespace", "command")

    def run(self, api, p):
        if not p.get("rolling_back"):
            return {"gpu_uuid": "", "result": "not rolling back"}
        node = p["node"]
        try:
            gpu_uuid = self._verify(api, p)
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

    def _verify(self, api, p) -> str:
        core, node, ns, resource = client.CoreV1Api(api), p["node"], p["namespace"], p["extended_resource"]

        def allocatable():
            count = kube_checks.allocatable(core.read_node(node), resource)
            return count > 0, count, f"{resource} allocatable {count}"

        wait_for(f"device plugin to offer {resource} on node {node}", allocatable, **_timing(p, 600))
        try:
            core.create_namespace({"metadata": {"name": ns}})
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


def _delete_pod_quietly(core, namespace: str, name: str) -> None:
    """Delete a check pod without letting a failure hide the error being raised (it is logged instead)."""
    try:
        core.delete_namespaced_pod(name, namespace)
    except Exception as e:  # noqa: BLE001
        if not (isinstance(e, ApiException) and e.status == 404):
            pulumi.log.warn(f"could not delete check pod {namespace}/{name}: {_short(e)}; delete it by hand "
                            f"(`kubectl delete pod -n {namespace} {name}`) or let the next `pulumi up` do it")


def _delete_rollback_pods(core, namespace: str, node: str) -> None:
    for pod in core.list_namespaced_pod(namespace, label_selector=rollback_selector(node)).items:
        pulumi.log.info(f"deleting check pod {namespace}/{pod.metadata.name} left by an interrupted run")
        _delete_pod_quietly(core, namespace, pod.metadata.name)


class RollbackVerification(Resource, module="gpu-migration", name="RollbackVerification"):
    """After the labels switched back: device-plugin GPUs allocatable, a smoke pod passes, then uncordon."""

    gpu_uuid: pulumi.Output[str]
    result: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        node: pulumi.Input[str],
        rolling_back: pulumi.Input[bool],
        extended_resource: pulumi.Input[str],
        image: pulumi.Input[str],
        namespace: pulumi.Input[str],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        command: Optional[pulumi.Input[Sequence[str]]] = None,  # default: nvidia-smi -L
        tolerations: Optional[Sequence[dict]] = None,  # the GPU nodes' taints
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, node=node, rolling_back=rolling_back, extended_resource=extended_resource,
                     image=image, namespace=namespace, command=command, tolerations=list(tolerations or []),
                     timeout=timeout, poll_interval=poll_interval, gpu_uuid=None, result=None)
        super().__init__(_RollbackVerificationProvider(), name, props, opts)


# --- GPU nodes of the cluster vs. the config (before the GPU Operator) --------------------------------------------


class _EveryUp(_Provider):
    """A read-only check that runs again on every `up` (shown as an update): the cluster changes between runs.
    `run` sees the previous outputs as `props["_previous"]` (none on create)."""

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=True, replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        with _client(news.get("kubeconfig")) as api:
            return UpdateResult(outs={**news, **self.run(api, {**news, "_previous": olds})})


class _GpuNodeInventoryProvider(_EveryUp):
    def run(self, api, p):
        found = kube_checks.inventory(api, p["configured"], p["worker_ids"], p["operator_min_version"],
                                      p.get("temp_pool"), seen=(p.get("_previous") or {}).get("seen"))
        for w in found.warnings:
            pulumi.log.warn(w)
        if found.problems:
            raise CheckFailed(f"GPU nodes in the cluster don't match gpu-migration:nodes; nothing was installed:"
                              f"{_bullets(found.problems)}")
        return {"checked": sorted(p["configured"]), "seen": found.seen}


class GpuNodeInventory(Resource, module="gpu-migration", name="GpuNodeInventory"):
    """Every GPU node of the cluster is listed in the config and every listed ibm-managed node exists; runs before
    the GPU Operator, so it never lands next to IBM's drivers on a node the config forgot."""

    checked: pulumi.Output[list[str]]

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], configured: dict[str, str],
                 worker_ids: dict[str, str], operator_min_version: str, temp_pool: Optional[str] = None,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = dict(kubeconfig=kubeconfig, configured=configured, worker_ids=worker_ids,
                     operator_min_version=operator_min_version, temp_pool=temp_pool, checked=None, seen=None)
        super().__init__(_GpuNodeInventoryProvider(), name, props, opts)


# --- the runbook's operator checks -----------------------------------------------------------------------------------


class _OperandPlacementProvider(_EveryUp):
    rerun_on = ("namespace", "fenced")

    def run(self, api, p):
        problems = kube_checks.operand_placement_problems(api, p["namespace"], p["fenced"],
                                                          p.get("operator_min_version"))
        if problems:
            raise CheckFailed(f"GPU Operator pods run on nodes with IBM-managed drivers:{_bullets(problems)}\n"
                              "stop: uninstall or fix the fence labels before going on")
        return {"checked": sorted(p["fenced"])}


class OperandPlacement(Resource, module="gpu-migration", name="OperandPlacement"):
    """No driver, device plugin, container toolkit or DCGM exporter pod on a fenced or ibm-managed node."""

    checked: pulumi.Output[list[str]]

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], namespace: str,
                 fenced: pulumi.Input[Sequence[pulumi.Input[str]]], operator_min_version: Optional[str] = None,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = dict(kubeconfig=kubeconfig, namespace=namespace, fenced=fenced,
                     operator_min_version=operator_min_version, checked=None)
        super().__init__(_OperandPlacementProvider(), name, props, opts)


class _PendingGpuPodsProvider(_Provider):
    rerun_on = ("node", "resources", "gate")

    def run(self, api, p):
        pending = kube_checks.pending_gpu_pods(api, p["resources"])
        if pending and p.get("gate"):
            raise CheckFailed(f"after node {p['node']}, GPU pods are still Pending (pendingGpuPodsGate is true):"
                              f"{_bullets(pending)}")
        if pending:
            pulumi.log.warn(f"after node {p['node']}, GPU pods still Pending:{_bullets(pending)}")
        return {"pending": pending}


class PendingGpuPods(Resource, module="gpu-migration", name="PendingGpuPods"):
    """After a node: the GPU pods still Pending, with their scheduling reason (a gate with pendingGpuPodsGate)."""

    pending: pulumi.Output[list[str]]

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], node: pulumi.Input[str],
                 resources: list[str], gate: bool, opts: Optional[pulumi.ResourceOptions] = None):
        props = dict(kubeconfig=kubeconfig, node=node, resources=resources, gate=gate, pending=None)
        super().__init__(_PendingGpuPodsProvider(), name, props, opts)
