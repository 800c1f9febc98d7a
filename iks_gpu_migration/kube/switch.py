"""Switching a node between the device-plugin path and the DRA path, one observable step at a time.

A GPU must never be offered on both paths. One label patch that adds the pilot label and turns the device plugin off
at once lets the DRA kubelet plugin publish GPUs that running device-plugin pods still hold: the scheduler uses DRA on
a node as soon as its device-plugin allocatable is 0 (KEP-5004; kubernetes
pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go), so those GPUs go to a second pod.

Forward (device-plugin -> dra): cordon; wait (timeouts.drain) until no pod on the node holds the plugin resource
(with drain.switchGpuPods: evict, those pods are evicted first under the drain's rules: evict_gpu_pods);
set nvidia.com/gpu.deploy.device-plugin=false; wait (timeouts.pathSwitch) until the node's allocatable of the plugin
resource is 0; only then add the pilot label. The smoke test verification uncordons.
Rollback (dra -> device-plugin): cordon; wait until GPU pods finished (or evict them first, as forward); remove the
pilot label; wait until the node's ResourceSlices of the driver are gone (the kubelet wipes them ~30 s after the plugin
unregisters, pkg/kubelet/cm/dra); set nvidia.com/gpu.deploy.device-plugin=true explicitly (the GPU Operator re-adds
a removed label only on a reconcile triggered by other label changes, controllers/state_manager.go). The rollback
check (kube/rollback.py verify_rollback) then runs a check pod on the device-plugin path and uncordons.

Only the standard Kubernetes API is used (kubernetes client), so this runs unchanged against a real API server. Each
step is idempotent: an interrupted switch resumes from the node's labels on the next `pulumi up`.
"""
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pulumi
from kubernetes import client
from pulumi.dynamic import DiffResult, ReadResult, Resource

from ..common.waiting import WaitTimeout, wait_for, waking_with
from . import cluster, eviction, finished
from .cordon import cordon, cordoned_for, uncordon_if_ours
from .labels import DEVICE_PLUGIN_LABEL
from .node_changes import woken_by_changes
from .clients import api_client
from .provider import CheckFailed, _Provider, _short, _timing
from .readiness import check_readiness
from .rollback import verify_rollback
from .refusals import explained


def set_labels(api, node: str, labels: dict[str, Optional[str]]) -> None:
    client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": labels}})


def _wait(what: str, poll, props: dict[str, Any], key: str, default: float, node: str, left: str) -> None:
    timing = {**_timing(props, default), "timeout": float(props.get(key) or default)}
    resume = f"node {node} is left cordoned, {left}; run `pulumi up` again to continue (the switch resumes where it " \
             f"stopped)"
    try:
        wait_for(what, poll, **timing)
    except WaitTimeout as e:
        raise CheckFailed(f"{e}\n{resume}") from None
    except Exception as e:  # an API error mid-wait: the node is cordoned all the same (Interrupted passes through)
        raise CheckFailed(f"reading the cluster failed while waiting for {what}: {_short(e)}\n{resume}") from e


def evict_gpu_pods(api, p: dict[str, Any], pods: list[str], left: str) -> None:
    """drain.switchGpuPods: evict. The GPU pods the switch is about to wait for are evicted first, under the drain's
    rules (PodDisruptionBudgets respected; kube/eviction.py evict_for_switch), so a long-running pod does not hold
    the node cordoned until timeouts.drain; what the rules leave (a DaemonSet's pod) is then awaited as before."""
    node = p["node"]
    if p.get("gpu_pods") != "evict" or not pods:
        return
    pulumi.log.info(f"node {node}: evicting its GPU pods before the switch (drain.switchGpuPods): {', '.join(pods)}")
    settings = {"kubeconfig": p.get("kubeconfig"), "timeout": p.get("drain_timeout"),
                "poll_interval": p.get("poll_interval"), "drain": p.get("drain_rules") or {}}
    try:
        went = eviction.evict_for_switch(api, node, pods, settings)
    except eviction.EvictionError as e:
        raise CheckFailed(f"{e}\nnode {node} is left cordoned, {left}; run `pulumi up` again to continue (the "
                          f"switch resumes where it stopped)") from None
    pulumi.log.info(f"node {node}: evicted {', '.join(went['evicted']) or 'no pod'}" +
                    (f"; left in place: {', '.join(went['skipped'])}" if went["skipped"] else ""))


def labels_of(api, node: str) -> dict[str, str]:
    return client.CoreV1Api(api).read_node(node).metadata.labels or {}


# With driver.manager.env NODE_LABEL_FOR_GPU_POD_EVICTION=<pilot label key>, NVIDIA's driver manager evicts the DRA
# kubelet plugin while it (re)installs the driver: it rewrites that label to `<value>_paused-for-driver-upgrade`
# (`paused-for-driver-upgrade` if the value is "true") and restores it afterwards; it also cordons and uncordons the
# node (NVIDIA/k8s-driver-manager cmd/driver-manager/main.go: maybeSetPaused, maybeSetTrue, uninstallDriver).
# The switch never writes the label while it is paused.
PAUSED = "paused-for-driver-upgrade"


def refuse_if_paused(node: str, labels: dict[str, str], key: str) -> None:
    if PAUSED in labels.get(key, ""):
        raise CheckFailed(
            f"node {node}: {key}={labels[key]}: the GPU Operator's driver manager is upgrading the driver there and "
            f"has paused the DRA kubelet plugin; nothing was changed. Run `pulumi up` again once the upgrade is done "
            f"(the label is back to its value)")


def forward(api, p: dict[str, Any]) -> bool:
    """device-plugin -> dra. Returns False if the node already was on the DRA path."""
    node, resource = p["node"], p["device_plugin_resource"]
    key, _, value = p["pilot_label"].partition("=")
    labels = labels_of(api, node)
    refuse_if_paused(node, labels, key)
    if labels.get(key) == value and labels.get(DEVICE_PLUGIN_LABEL) == "false":
        return False
    pulumi.log.info(f"node {node}: switching from the device plugin to DRA; cordoning it")
    cordon(api, node, "dra")

    if labels.get(DEVICE_PLUGIN_LABEL) != "false":
        evict_gpu_pods(api, p, cluster.device_plugin_gpu_pods(api, node, resource),
                       "its device plugin still on and no pilot label")

        def plugin_pods():
            pods = cluster.device_plugin_gpu_pods(api, node, resource)
            return not pods, pods, f"pods holding {resource} through the device plugin: {', '.join(pods)}"

        _wait(f"device-plugin GPU pods on node {node} to finish or move", plugin_pods, p, "drain_timeout", 1800, node,
              "its device plugin still on and no pilot label")
        set_labels(api, node, {DEVICE_PLUGIN_LABEL: "false"})

    def plugin_gone():
        # Also no pod holding a plugin GPU (one that tolerates the cordon may have started meanwhile).
        count = cluster.allocatable(client.CoreV1Api(api).read_node(node), resource)
        pods = cluster.device_plugin_gpu_pods(api, node, resource)
        return count == 0 and not pods, count, f"{resource} allocatable {count}" + (
            f", pods holding it: {', '.join(pods)}" if pods else "")

    _wait(f"node {node} to stop offering {resource} through the device plugin", plugin_gone, p, "switch_timeout", 300,
          node, f"{DEVICE_PLUGIN_LABEL}=false set and no pilot label yet")
    set_labels(api, node, {key: value})
    pulumi.log.info(f"node {node}: device plugin off, pilot label {key}={value} set; DRA publishes its GPUs")
    return True


def rollback(api, p: dict[str, Any]) -> bool:
    """dra -> device-plugin. Returns False if the node was not on (or switching to) the DRA path."""
    node, driver = p["node"], p["driver"]
    key = p["pilot_label"].partition("=")[0]
    labels = labels_of(api, node)
    if key not in labels and labels.get(DEVICE_PLUGIN_LABEL) != "false":
        if cordoned_for(api, node) == "device-plugin":
            # A rollback got the labels back and was cut short before its check (the check uncordons): resume there.
            pulumi.log.info(f"node {node}: back on the device plugin, cordoned by an unfinished rollback; checking it")
            return True
        # Never left the device-plugin path (e.g. a forward switch that timed out waiting for GPU pods and was then
        # called off): only the cordon it left behind has to go.
        if uncordon_if_ours(api, node):
            pulumi.log.info(f"node {node}: still on the device plugin; uncordoned (an unfinished switch cordoned it)")
        return False
    refuse_if_paused(node, labels, key)
    pulumi.log.info(f"node {node}: rolling back from DRA to the device plugin; cordoning it")
    cordon(api, node, "device-plugin")
    evict_gpu_pods(api, p, cluster.gpu_pods(api, node, p["extended_resource"]), "its labels unchanged")

    def gpu_pods():
        pods = cluster.gpu_pods(api, node, p["extended_resource"])
        return not pods, pods, f"GPU pods still running: {', '.join(pods)}"

    _wait(f"GPU pods on node {node} to finish", gpu_pods, p, "drain_timeout", 1800, node, "its labels unchanged")
    if key in labels:
        set_labels(api, node, {key: None})

    def slices_gone():
        count = cluster.devices_per_node(api, driver).get(node, 0)
        return count == 0, count, f"{count} DRA devices of driver {driver} still published"

    _wait(f"ResourceSlices of driver {driver} on node {node} to be wiped", slices_gone, p, "switch_timeout", 300, node,
          f"pilot label removed, {DEVICE_PLUGIN_LABEL} still false")
    set_labels(api, node, {DEVICE_PLUGIN_LABEL: "true"})
    pulumi.log.info(f"node {node}: DRA devices gone, {DEVICE_PLUGIN_LABEL}=true set")
    return True


def wait_registered(api, p: dict[str, Any]) -> None:
    """A replaced worker's Node registers a little after IKS reports the worker deployed; the switch reads and labels
    that Node, so it waits for it, bounded, instead of failing on a 404 (readiness is a later step's concern)."""
    node = p["node"]

    def registered():
        try:
            client.CoreV1Api(api).read_node(node)
        except client.ApiException as e:
            if e.status == 404:
                return False, "not registered", "no Node object yet"
            raise
        return True, "registered", "registered"

    timing = {**_timing(p, 300), "timeout": float(p.get("switch_timeout") or 300)}
    try:
        wait_for(f"node {node} to register", registered, **timing)
    except WaitTimeout as e:
        raise CheckFailed(f"{e}\nnothing was changed on the node; check the worker behind it (`ibmcloud ks worker get`) "
                          f"and run `pulumi up` again") from None


def observed_path(labels: dict[str, str], pilot_label: str) -> str:
    """Which path the node's labels put it on: dra (pilot label, plugin off), device-plugin (neither), or mixed."""
    key, _, value = pilot_label.partition("=")
    pilot, plugin_off = labels.get(key) == value, labels.get(DEVICE_PLUGIN_LABEL) == "false"
    if pilot and plugin_off:
        return "dra"
    return "device-plugin" if not pilot and not plugin_off else "mixed"


class _NodePathSwitchProvider(_Provider):
    # What the node's path or readiness depends on; the rollback check's pod settings only matter while a rollback
    # runs, so a new smoke image does not run every device-plugin node's checks again.
    rerun_on = ("node", "target", "pilot_label", "device_plugin_resource", "extended_resource", "driver",
                "operator_namespace", "dra_namespace", "gpu_resources", "pending_gate")
    kept = (*rerun_on, "kubeconfig")  # read's too; the timeouts and the check pod's settings steer a run only
    # Inputs since the rollback check and the readiness check moved in here (they were resources of their own: a
    # switch recorded before ran next to them, and the same `up` deletes them): nothing to run again for them.
    ABSORBED = ("check_image", "check_namespace", "check_command", "check_tolerations", "check_timeout",
                "operator_namespace", "dra_namespace", "config_name", "operator_min_version", "gpu_resources",
                "pending_gate", "ready_timeout")

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        """`pulumi refresh`: the path the node's labels show now (someone may have removed the pilot label or turned
        the device plugin back on). A node that is gone reads `missing`."""
        with api_client(props.get("kubeconfig")) as api, explained():
            try:
                path = observed_path(labels_of(api, props["node"]), props["pilot_label"])
            except client.ApiException as e:
                if e.status != 404:
                    raise
                path = "missing"
        return ReadResult(id_, {**props, "observed_path": path})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """As a check, plus: a refresh that saw the node off its target path runs the switch again (it repairs the
        labels step by step, as on the way there)."""
        if "ready" not in olds and "ready_timeout" not in olds:  # recorded before readiness moved in
            olds = {**olds, **{k: news.get(k) for k in self.ABSORBED}}
        result = super().diff(id_, olds, news)
        seen = olds.get("observed_path")
        if seen and seen != news.get("target"):
            return DiffResult(changes=True, replaces=sorted({*(result.replaces or []), "target"}),
                              delete_before_replace=True)
        return result

    def run(self, api, p):
        # Every wait below is on this node (its labels, allocatable, pods, slices): each wakes on its changes.
        with woken_by_changes(p.get("kubeconfig"), p["node"], slices=True) as sleep, waking_with(sleep):
            return self._run(api, p)

    def _run(self, api, p):
        wait_registered(api, p)
        if p["target"] == "dra":
            outs = {"switched": forward(api, p), "rolling_back": False}
        else:
            outs = {"switched": False, "rolling_back": rollback(api, p)}
        if p.get("check_image"):  # device-plugin: a rollback is proven by a check pod (kube/rollback.py)
            outs.update(verify_rollback(api, rollback_check(p, outs["rolling_back"])))
        if p.get("operator_namespace"):
            outs.update(check_readiness(api, readiness_check(p)))
        if p["target"] != "dra":  # a device-plugin node's last step: its slot's peers count it back (kube/finished.py)
            finished.record(p["node"], p.get("config_name") or "")
        return outs


def rollback_check(p: dict[str, Any], rolling_back: bool) -> dict[str, Any]:
    """verify_rollback's settings from the switch's: the check pod asks for the device plugin's resource."""
    return {"kubeconfig": p.get("kubeconfig"), "node": p["node"], "rolling_back": rolling_back,
            "extended_resource": p["device_plugin_resource"], "image": p["check_image"],
            "namespace": p["check_namespace"], "command": p.get("check_command"),
            "tolerations": p.get("check_tolerations") or [], "timeout": p.get("check_timeout"),
            "poll_interval": p.get("poll_interval")}


def readiness_check(p: dict[str, Any]) -> dict[str, Any]:
    """check_readiness's settings from the switch's."""
    return {"node": p["node"], "stage": p["target"], "namespace": p["operator_namespace"], "driver": p.get("driver"),
            "device_plugin_resource": p.get("device_plugin_resource"), "dra_namespace": p.get("dra_namespace"),
            "config_name": p.get("config_name"), "operator_min_version": p.get("operator_min_version"),
            "resources": p.get("gpu_resources") or [], "gate": p.get("pending_gate"),
            "timeout": p.get("ready_timeout"), "poll_interval": p.get("poll_interval")}


@dataclass(frozen=True)
class RollbackCheck:
    """The check pod that proves a rollback (device-plugin stage; kube/rollback.py verify_rollback)."""
    image: str
    namespace: str
    timeout: float
    command: Optional[Sequence[str]] = None  # default: nvidia-smi -L
    tolerations: Sequence[dict] = ()  # the GPU nodes' taints


@dataclass(frozen=True)
class Readiness:
    """What the node must show once on its path (kube/readiness.py check_readiness)."""
    operator_namespace: pulumi.Input[str]  # resolves once the operator, its placement check and DRA driver are in
    timeout: float
    operator_min_version: str  # operand placement: nodes below it keep IBM's drivers
    gpu_resources: Sequence[str]  # GPU resources whose Pending pods are listed after the node
    pending_gate: bool = False  # pendingGpuPodsGate: a Pending GPU pod stops `up`
    dra_namespace: Optional[str] = None  # dra stage: the DRA kubelet plugin pod must be Ready
    config_name: Optional[str] = None  # the node's name in gpu-migration:nodes, recorded on the node


class NodePathSwitch(Resource, module="gpu-migration", name="NodePathSwitch"):
    """Moves the node to `target` ("dra" or "device-plugin") step by step (a no-op if it is already there); with
    `rollback_check`, proves a rollback to the device plugin with a check pod and uncordons; with `readiness`, waits
    until the node's operands run and its GPUs are offered on its path, then checks operand placement and lists the
    GPU pods still Pending. One resource for the node's steps after its replacement: each resource costs every state
    save its whole size (docs/fleet-scale.md)."""

    switched: pulumi.Output[bool]  # forward switch done by this run (the smoke test then uncordons)
    rolling_back: pulumi.Output[bool]  # rollback done by this run (its check then uncordoned the node)
    gpu_uuid: pulumi.Output[str]  # the GPU the rollback check pod got ("" without a rollback)
    result: pulumi.Output[str]  # the rollback check's result
    ready: pulumi.Output[bool]
    pending: pulumi.Output[list[str]]  # GPU pods still Pending after the node

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        node: pulumi.Input[str],
        target: str,
        pilot_label: str,
        device_plugin_resource: str,
        extended_resource: str,
        driver: str,
        drain_timeout: float,
        switch_timeout: float,
        poll_interval: float,
        rollback_check: Optional[RollbackCheck] = None,
        readiness: Optional[Readiness] = None,
        evict_with: Optional[dict[str, Any]] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, node=node, target=target, pilot_label=pilot_label,
                     device_plugin_resource=device_plugin_resource, extended_resource=extended_resource,
                     driver=driver, drain_timeout=drain_timeout, switch_timeout=switch_timeout,
                     poll_interval=poll_interval, switched=None, rolling_back=None)
        if evict_with is not None:  # drain.switchGpuPods: evict, under these rules of `drain:`
            props.update(gpu_pods="evict", drain_rules=evict_with)
        if rollback_check is not None:
            props.update(check_image=rollback_check.image, check_namespace=rollback_check.namespace,
                         check_command=list(rollback_check.command) if rollback_check.command else None,
                         check_tolerations=list(rollback_check.tolerations), check_timeout=rollback_check.timeout,
                         gpu_uuid=None, result=None)
        if readiness is not None:
            props.update(operator_namespace=readiness.operator_namespace, dra_namespace=readiness.dra_namespace,
                         config_name=readiness.config_name, operator_min_version=readiness.operator_min_version,
                         gpu_resources=list(readiness.gpu_resources), pending_gate=readiness.pending_gate,
                         ready_timeout=readiness.timeout, ready=None, pending=None)
        super().__init__(_NodePathSwitchProvider(), name, props, opts)
