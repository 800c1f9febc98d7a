"""A simulated `pulumi up` for tests/test_up_end_to_end.py.

`UpMocks` plays the engine under Pulumi mocks: dynamic resources run their real provider (dill-loaded from
`__provider`) against the IKS and Kubernetes emulators; a resource known from a previous run is diffed by its provider
(unchanged: old outputs, replace: create again, else update); resources no longer declared are deleted after a
successful run. `Cluster` plays what the cluster itself does: workers joining as nodes, the GPU Operator and DRA driver
reacting to node labels, the scheduler, DRA allocation and pods running to completion. Everything that changes the
emulators is appended to one `Timeline` with a sequence number, so tests assert orderings, not sleeps.
"""
import base64
import copy
import itertools
import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import dill
import pulumi
from kubernetes import client, config as kube_config
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import ConfigureRequest
from pulumi.runtime.rpc import _special_secret_sig as SECRET_SIG, _special_sig_key as SECRET_SIG_KEY

from iks_gpu_migration import config
from tests.emulators.iks import IksEmulator
from tests.emulators.kube import KubeEmulator

DYNAMIC_PREFIX = "pulumi-python:dynamic"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
OPERATOR_NS = "gpu-operator"
# gpuStateLabels (container workload) of NVIDIA/gpu-operator v25.10.1 controllers/state_manager.go.
GPU_STATE_LABELS = {f"nvidia.com/gpu.deploy.{o}" for o in (
    "driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm", "dcgm-exporter",
    "node-status-exporter", "operator-validator")}


# --- timeline --------------------------------------------------------------------------------------------------------

@dataclass
class Event:
    seq: int
    at: float
    kind: str
    detail: dict

    def __repr__(self) -> str:
        return f"#{self.seq} {self.kind} {self.detail}"


class Timeline:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._seq = itertools.count(1)

    def add(self, kind: str, **detail: Any) -> Event:
        with self._lock:
            event = Event(next(self._seq), time.monotonic(), kind, detail)
            self.events.append(event)
            return event

    def all(self, kind: str, **match: Any) -> list[Event]:
        return [e for e in self.events if e.kind == kind and all(e.detail.get(k) == v for k, v in match.items())]

    def one(self, kind: str, **match: Any) -> Event:
        found = self.all(kind, **match)
        assert len(found) == 1, f"expected one {kind} {match}, got {found}\ntimeline:\n" + self.dump()
        return found[0]

    def dump(self) -> str:
        return "\n".join(map(repr, self.events))


# --- emulators that record their mutations -------------------------------------------------------------------------

class RecordingIks(IksEmulator):
    """IKS whose mutations go to the timeline; a worker that becomes deployed joins the cluster as a node (named by
    its primary IP, as on VPC) and a deleted one leaves it."""

    def __init__(self, timeline: Timeline, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeline = timeline
        self.cluster_sim: Optional["Cluster"] = None

    def route(self, method, path, q, body):
        status, payload = super().route(method, path, q, body)
        if method != "GET":
            self.timeline.add(f"iks {method} {path}", worker=(body or {}).get("workerID"), body=body)
        return status, payload

    def _deploy(self, worker: dict) -> None:
        was = worker["lifecycle"]["actualState"]
        super()._deploy(worker)
        if was != "deployed" and worker["lifecycle"]["actualState"] == "deployed" and self.cluster_sim:
            self.cluster_sim.join(worker)

    def _delete_worker(self, worker: dict, reason: str) -> None:
        super()._delete_worker(worker, reason)
        if self.cluster_sim:
            self.cluster_sim.leave(worker)


class RecordingKube(KubeEmulator):
    """Kubernetes API whose successful writes go to the timeline and let the simulated controllers react."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self.timeline = timeline
        self.cluster_sim: Optional["Cluster"] = None

    def handle(self, method, path, query, body, content_type, dry_run=None):
        status, payload = super().handle(method, path, query, body, content_type, dry_run)
        if method != "GET" and status < 300 and dry_run != "All":
            self.timeline.add(f"kube {method}", path=path, body=copy.deepcopy(body))
            if self.cluster_sim:
                self.cluster_sim.reconcile()
        return status, payload


# --- the cluster's own behaviour ---------------------------------------------------------------------------------

def gpu_uuid(node: str) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, node)}"


def _labels(obj: dict) -> dict:
    return obj["metadata"].get("labels") or {}


class Cluster:
    """Controllers of the simulated cluster. Every method runs under the kube emulator's lock."""

    def __init__(self, iks: RecordingIks, kube: RecordingKube, timeline: Timeline, kubeconfig: str,
                 extended_resource: str, dra_driver_name: str) -> None:
        self.iks, self.kube, self.timeline, self.er = iks, kube, timeline, extended_resource
        self.kubeconfig, self.dra_driver_name = kubeconfig, dra_driver_name
        self.ibm_driver_nodes: set[str] = set()  # nodes still on IBM's drivers (old workers)
        self.operator: Optional[dict] = None  # gpu-operator release inputs
        self.dra_driver: Optional[dict] = None  # dra-driver release inputs
        self.device_classes: dict[str, dict] = {}
        self.publish_slices = True  # the DRA driver's kubelet plugin publishes ResourceSlices
        self.smoke_log_uuid: Optional[str] = None  # a GPU the smoke container claims to see (default: allocated)
        self.operator_conflicts: list[str] = []  # operator operands scheduled onto a node with IBM's drivers
        self.operator_ignores_fence = False  # fault: the operator starts its driver on fenced nodes anyway
        self.owned_labels: dict[tuple[str, str], set[str]] = {}  # (node, field manager) -> label keys (SSA)
        self._ids = itertools.count(1)
        iks.cluster_sim = self
        kube.cluster_sim = self
        kube.on_pod_create = self.schedule

    # nodes ---------------------------------------------------------------------------------------------------------
    def add_ibm_node(self, name: str) -> None:
        with self.kube.lock:
            self.kube.add_node(name, labels={"nvidia.com/gpu.present": "true"}, allocatable={"nvidia.com/gpu": "1"},
                               kubelet_version="v1.35.4+IKS")
            self.ibm_driver_nodes.add(name)

    def join(self, worker: dict) -> None:
        name = worker["networkInterfaces"][0]["ipAddress"]
        with self.kube.lock:
            self.kube.add_node(name, labels={"nvidia.com/gpu.present": "true"})
            self.timeline.add("node joined", node=name, worker=worker["id"])
            self.reconcile()

    def leave(self, worker: dict) -> None:
        name = worker["networkInterfaces"][0]["ipAddress"]
        with self.kube.lock:
            if self.kube.nodes.pop(name, None) is not None:
                self.timeline.add("node left", node=name, worker=worker["id"])
            self.ibm_driver_nodes.discard(name)
            for key in [k for k, p in self.kube.pods.items() if p["spec"].get("nodeName") == name]:
                del self.kube.pods[key]
            self.kube.slices[:] = [s for s in self.kube.slices if s["spec"]["nodeName"] != name]

    def apply_labels(self, manager: str, node: str, labels: dict[str, str]) -> None:
        """Server-side apply of metadata.labels by `manager` (force): labels it owned and no longer lists go."""
        api = self.api()
        with api:
            owned = self.owned_labels.get((node, manager), set())
            patch = {**{k: None for k in owned - set(labels)}, **labels}
            if patch:
                client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": patch}})
            else:
                client.CoreV1Api(api).read_node(node)  # 404 if the node is not there
        self.owned_labels[(node, manager)] = set(labels)
        self.timeline.add("labels applied", node=node, labels=dict(labels), removed=sorted(owned - set(labels)))

    def api(self):
        return kube_config.new_client_from_config(config_file=self.kubeconfig)

    # GPU Operator and DRA driver ---------------------------------------------------------------------------------
    def reconcile(self) -> None:
        with self.kube.lock:
            for name, node in list(self.kube.nodes.items()):
                labels = _labels(node)
                if self.operator is not None and labels.get("nvidia.com/gpu.deploy.operands") == "false":
                    # NVIDIA/gpu-operator controllers/state_manager.go: updateGPUStateLabels -> removeAllGPUStateLabels
                    for key in [k for k in labels if k in GPU_STATE_LABELS]:
                        del labels[key]
                        self.timeline.add("operator removed label", node=name, label=key)
                operands = self.operator is not None and labels.get("nvidia.com/gpu.deploy.operands") != "false"
                if name in self.ibm_driver_nodes:
                    if operands and name not in self.operator_conflicts:
                        self.operator_conflicts.append(name)
                        self.timeline.add("operator operands on a node with IBM drivers", node=name)
                    if self.operator is not None and self.operator_ignores_fence:
                        self._operand(name, "nvidia-driver-daemonset", True)
                    continue
                plugin = operands and labels.get("nvidia.com/gpu.deploy.device-plugin") != "false"
                self._operand(name, "nvidia-driver-daemonset", operands)
                self._operand(name, "nvidia-container-toolkit-daemonset", operands)
                self._operand(name, "nvidia-device-plugin-daemonset", plugin)
                allocatable = node["status"].setdefault("allocatable", {})
                if plugin and allocatable.get(self.er) != "1":
                    allocatable[self.er] = "1"
                    self.timeline.add("device plugin serving", node=name)
                elif not plugin and allocatable.pop(self.er, None):
                    self.timeline.add("device plugin gone", node=name)
                self._slices(name, operands and self._kubelet_plugin_selects(labels))

    def _kubelet_plugin_selects(self, labels: dict) -> bool:
        if self.dra_driver is None or not self.publish_slices:
            return False
        selector = ((self.dra_driver.get("values") or {}).get("kubeletPlugin") or {}).get("nodeSelector") or {}
        return all(labels.get(k) == v for k, v in selector.items())

    def _operand(self, node: str, component: str, wanted: bool) -> None:
        key = (OPERATOR_NS, f"{component}-{node}")
        if wanted and key not in self.kube.pods:
            pod = self.kube.add_pod(OPERATOR_NS, key[1], node=node, ready=False, waiting="ContainerCreating")
            pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": component,
                                                   "uid": f"uid-{component}", "controller": True}]
            # Operands become ready after the readiness check has seen them starting (twice).
            def ready() -> None:
                if self.kube.pods.get(key) is not pod:
                    return  # removed meanwhile (e.g. the device plugin on a node labelled for DRA)
                pod["status"]["containerStatuses"][0].update(ready=True, state={"running": {}})
                self.timeline.add("operand ready", node=node, component=component)
            self.kube.after(2, f"namespaces/{OPERATOR_NS}/pods", ready)
        elif not wanted and key in self.kube.pods:
            del self.kube.pods[key]

    def _slices(self, node: str, wanted: bool) -> None:
        """The DRA kubelet plugin pod (Ready) and its ResourceSlice on nodes the chart's nodeSelector picks."""
        driver = self.dra_driver_name
        mine = [s for s in self.kube.slices if s["spec"]["nodeName"] == node and s["spec"]["driver"] == driver]
        plugin = self.kubelet_plugin_pod(node)
        if wanted and not mine:
            self.kube.add_slice(node, driver, {"gpu-0": gpu_uuid(node)})
            self.kube.add_pod(*plugin, node=node)
            self.timeline.add("slices published", node=node)
        elif not wanted and mine:
            self.kube.slices[:] = [s for s in self.kube.slices if s not in mine]
            self.kube.pods.pop(plugin, None)
            self.timeline.add("slices withdrawn", node=node)

    def kubelet_plugin_pod(self, node: str) -> tuple[str, str]:
        namespace = (self.dra_driver or {}).get("namespace") or "nvidia-dra-driver-gpu"
        return namespace, f"nvidia-dra-driver-gpu-kubelet-plugin-{node}"

    # Helm / DeviceClass --------------------------------------------------------------------------------------------
    def install(self, release: str, inputs: Optional[dict]) -> None:
        with self.kube.lock:
            setattr(self, {"gpu-operator": "operator", "dra-driver": "dra_driver"}[release], inputs)
            self.timeline.add("helm install" if inputs else "helm uninstall", release=release)
            self.reconcile()

    def set_device_class(self, name: str, spec: Optional[dict]) -> None:
        with self.kube.lock:
            if spec is None:
                self.device_classes.pop(name, None)
            else:
                self.device_classes[name] = spec
            self.reconcile()

    # scheduler and kubelet ------------------------------------------------------------------------------------------
    def _dra_class_driver(self, resource: str) -> Optional[str]:
        for spec in self.device_classes.values():
            if spec.get("extendedResourceName") == resource:
                for s in spec.get("selectors") or []:
                    m = re.match(r'device\.driver == "([^"]+)"', s["cel"]["expression"])
                    if m:
                        return m.group(1)
        return None

    def schedule(self, pod: dict) -> None:
        """on_pod_create: bind to a fitting node, allocate its GPU (device plugin first, else DRA), run it."""
        meta, spec = pod["metadata"], pod["spec"]
        ns, name = meta["namespace"], meta["name"]
        wants_gpu = any(self.er in (c.get("resources") or {}).get("limits", {}) for c in spec["containers"])
        tolerates = any(t.get("key") == UNSCHEDULABLE for t in spec.get("tolerations") or [])
        selector = spec.get("nodeSelector") or {}
        for node_name, node in self.kube.nodes.items():
            if not all(_labels(node).get(k) == v for k, v in selector.items()):
                continue
            if node["spec"].get("unschedulable") and not tolerates:
                continue
            path, status = "none", {}
            if wants_gpu:
                driver = self._dra_class_driver(self.er)
                devices = [s for s in self.kube.slices if s["spec"]["nodeName"] == node_name
                           and s["spec"]["driver"] == driver]
                if int(node["status"].get("allocatable", {}).get(self.er, "0")) > 0:
                    path = "device-plugin"
                elif devices:
                    path = "dra"
                    claim = f"{name}-extended-resources-{next(self._ids):05d}"
                    created = self.kube.add_claim(ns, claim, [{"driver": driver, "pool": node_name, "device": "gpu-0",
                                                               "request": "container-0-request-0"}])
                    # The kubelet plugin prepares the claim and logs it (v25.8 format: the claim UID).
                    plugin_log = self.kubelet_plugin_pod(node_name)
                    self.kube.logs[plugin_log] = self.kube.logs.get(plugin_log, "") + (
                        f"Returning newly prepared devices for claim '{created['metadata']['uid']}': [gpu-0]\n")
                    status["extendedResourceClaimStatus"] = {"resourceClaimName": claim, "requestMappings": [
                        {"containerName": spec["containers"][0]["name"], "resourceName": self.er,
                         "requestName": "container-0-request-0"}]}
                else:
                    continue
            spec["nodeName"] = node_name
            pod["status"] = {"phase": "Running", **status,
                             "conditions": [{"type": "PodScheduled", "status": "True"}],
                             "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "",
                                                    "ready": True, "restartCount": 0, "state": {"running": {}}}
                                                   for c in spec["containers"]]}
            self.timeline.add("pod scheduled", pod=f"{ns}/{name}", node=node_name, path=path)
            seen = self.smoke_log_uuid if self.smoke_log_uuid and name.startswith("gpu-smoke-") else gpu_uuid(node_name)
            self.kube.after(2, f"pods/{name}", lambda: self._finish(pod, f"GPU 0: NVIDIA A100 (UUID: {seen})\n"))
            return
        pod["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no node fits"}]}
        self.timeline.add("pod unschedulable", pod=f"{ns}/{name}")

    def _finish(self, pod: dict, log: str) -> None:
        meta = pod["metadata"]
        self.kube.logs[(meta["namespace"], meta["name"])] = log
        pod["status"]["phase"] = "Succeeded"
        for c in pod["status"].get("containerStatuses") or []:
            c.update(ready=False, state={"terminated": {"exitCode": 0, "reason": "Completed"}})
        self.timeline.add("pod finished", pod=f"{meta['namespace']}/{meta['name']}")


# --- the engine -------------------------------------------------------------------------------------------------------

def unwrap(value: Any) -> Any:
    """Inputs as a provider sees them: secrets unwrapped."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            return unwrap(value.get("value"))
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


@dataclass
class State:
    typ: str
    id: str
    inputs: dict
    outputs: dict


class _StackConfig:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str) -> Optional[str]:
        return self.values.get(key)


class UpMocks(pulumi.runtime.Mocks):
    def __init__(self, cluster: Cluster, prior: Optional[dict[str, State]], stack_config: dict[str, str]) -> None:
        self.cluster, self.timeline = cluster, cluster.timeline
        self.prior = prior or {}
        self.state: dict[str, State] = {}
        self.order: list[str] = []  # names in the order their operation finished
        self.stack_config = stack_config
        self._lock = threading.Lock()

    def call(self, args):
        return {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        name, typ = args.name, args.typ
        inputs = unwrap(dict(args.inputs))
        prior = self.prior.get(name)
        self.timeline.add("register", name=name)
        try:
            state, op = self._step(typ, name, inputs, prior)
        except Exception as e:
            self.timeline.add("failed", name=name, error=str(e))
            raise
        self.timeline.add(op, name=name)
        with self._lock:
            self.state[name] = state
            self.order.append(name)
        return state.id, state.outputs

    def _step(self, typ: str, name: str, inputs: dict, prior: Optional[State]) -> tuple[State, str]:
        if typ.startswith(DYNAMIC_PREFIX):  # pulumi-python:dynamic:Resource or pulumi-python:dynamic/<module>:<name>
            return self._dynamic(typ, name, inputs, prior)
        if prior is not None and prior.inputs == inputs:
            return prior, "same"
        op = "create" if prior is None else "replace"
        outputs = dict(inputs)
        if typ == "kubernetes:core/v1:NodePatch":
            self.cluster.apply_labels(f"pulumi-{name}", inputs["metadata"]["name"],
                                      inputs["metadata"].get("labels") or {})
            op = "create" if prior is None else "update"
        elif typ == "kubernetes:core/v1:Pod":
            if prior is not None:
                self._delete(name, prior)
            outputs = {**inputs, "metadata": self._create_pod(inputs), "status": {}}
        elif typ == "kubernetes:core/v1:Namespace":
            with self.cluster.api() as api:
                try:
                    client.CoreV1Api(api).create_namespace({"metadata": {"name": inputs["metadata"]["name"]}})
                except ApiException as e:
                    if e.status != 409:
                        raise
        elif typ == "kubernetes:helm.sh/v3:Release":
            self.cluster.install(name, inputs)
        elif typ == "kubernetes:resource.k8s.io/v1:DeviceClass":
            self.cluster.set_device_class(inputs["metadata"]["name"], inputs["spec"])
        return State(typ, f"{name}-id", inputs, outputs), op

    def _create_pod(self, inputs: dict) -> dict:
        body = {k: inputs[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        with self.cluster.api() as api:
            created = client.CoreV1Api(api).create_namespaced_pod(body["metadata"]["namespace"], body)
            return api.sanitize_for_serialization(created.metadata)

    def _provider(self, inputs: dict):
        provider = dill.loads(base64.b64decode(inputs["__provider"]))
        if hasattr(provider, "configure"):  # as the dynamic provider host does, with the stack config
            provider.configure(ConfigureRequest(_StackConfig(self.stack_config)))
        return provider

    def _dynamic(self, typ: str, name: str, inputs: dict, prior: Optional[State]) -> tuple[State, str]:
        provider = self._provider(inputs)
        if prior is not None:
            diff = provider.diff(prior.id, prior.outputs, inputs)
            if not diff.changes:
                return prior, "same"
            if not diff.replaces:
                result = provider.update(prior.id, prior.outputs, inputs)
                return State(typ, prior.id, inputs, {**result.outs, "__provider": inputs["__provider"]}), "update"
            if diff.delete_before_replace:
                self._delete(name, prior)
        self.timeline.add("create started", name=name)
        result = provider.create(inputs)
        return State(typ, result.id, inputs, {**result.outs, "__provider": inputs["__provider"]}), \
            "create" if prior is None else "replace"

    def _delete(self, name: str, state: State) -> None:
        if state.typ.startswith(DYNAMIC_PREFIX):
            self._provider(state.outputs).delete(state.id, state.outputs)
        elif state.typ == "kubernetes:core/v1:Pod":
            meta = state.outputs["metadata"]
            with self.cluster.api() as api:
                try:
                    client.CoreV1Api(api).delete_namespaced_pod(meta["name"], meta["namespace"])
                except ApiException as e:
                    if e.status != 404:
                        raise
        elif state.typ == "kubernetes:helm.sh/v3:Release":
            self.cluster.install(name, None)
        elif state.typ == "kubernetes:resource.k8s.io/v1:DeviceClass":
            self.cluster.set_device_class(state.inputs["metadata"]["name"], None)
        self.timeline.add("delete", name=name)

    def delete_removed(self) -> None:
        """After a successful run the engine deletes what is no longer declared (dependants first)."""
        for name in reversed(list(self.prior)):
            if name not in self.state:
                self._delete(name, self.prior[name])


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class UpResult:
    state: dict[str, State]
    order: list[str]
    error: Optional[BaseException]
    log: list[logging.LogRecord] = field(default_factory=list)

    def warnings(self) -> list[str]:
        return [r.getMessage() for r in self.log if r.levelno == logging.WARNING]

    def outputs(self, name: str) -> dict:
        return self.state[name].outputs


def up(cluster: Cluster, raw: dict[str, Any], api_key: str, prior: Optional[dict[str, State]] = None) -> UpResult:
    """One `pulumi up` of the program with stack config `raw` (camelCase keys) and the secret API key."""
    from iks_gpu_migration import migration

    values = {f"{config.NAMESPACE}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    values[f"{config.NAMESPACE}:ibmApiKey"] = api_key
    mocks = UpMocks(cluster, prior, values)
    logger = logging.getLogger(f"e2e-up-{id(mocks)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = _ListHandler()
    logger.addHandler(handler)
    pulumi.runtime.set_mocks(mocks, project="gpu-migration", stack="pilot", preview=False, logger=logger)
    pulumi.runtime.set_all_config(values, [f"{config.NAMESPACE}:ibmApiKey"])

    @pulumi.runtime.test
    def program():
        migration.export(migration.declare(config.load()))

    cluster.timeline.add("up started")
    error: Optional[BaseException] = None
    try:
        program()
    except Exception as e:  # noqa: BLE001 - the test judges it
        error = e
    if error is None:
        mocks.delete_removed()
    cluster.timeline.add("up finished", error=str(error) if error else None)
    return UpResult(dict(mocks.state), list(mocks.order), error, handler.records)
