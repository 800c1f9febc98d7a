"""Envtest for the fast tests: one real etcd + kube-apiserver for the whole test session, as controller-runtime's
envtest does (pkg/internal/testing/controlplane), started by gpu_migration_local.control_plane.ControlPlane with no
other component. Loopback only; a missing binary fails with the command that builds it.

What the missing components would do is played here, small and explicit, the way kwok plays it on the real control
plane (tests/real/):

- Nodes are kwok-style objects (annotation kwok.x-k8s.io/node=fake); their status (allocatable, nodeInfo, Ready,
  the kubelet endpoint) is written through the status subresource, as a kubelet or kwok writes it.
- Pods have no kubelet: a test sets their status through the status subresource. `Terminator` finishes graceful
  deletions (the kubelet deletes a terminating pod once its containers stopped: grace period 0), so deletes and
  evictions of bound pods complete as on a cluster.
- Pod logs: the API server proxies pods/log to the node's kubelet endpoint, which is the kubelet log double
  (gpu_migration_local/kubelet_logs.py), as LocalCluster wires it.
- No scheduler: a test that needs a pod bound binds it through the pods/binding subresource (`Kube.bind`).
- No controller-manager: PodDisruptionBudget status is written by the test as the disruption controller would.

Per-test isolation (`Kube`, fixture `kube` in tests/conftest.py): every name a test creates carries its prefix
(`kube.name("n1")` -> "t12-n1"): its namespaces, nodes, ResourceSlices and DeviceClasses. Teardown deletes all of them.
"""
from __future__ import annotations

import itertools
import json
import pathlib
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from kubernetes import client, config as kconfig, watch
from kubernetes.client.exceptions import ApiException

from gpu_migration_local import tools
from gpu_migration_local.control_plane import (ControlPlane, remove_workdir, self_signed_cert, temp_workdir,
                                               write_private)
from gpu_migration_local.iks_nodes import node_info
from gpu_migration_local.kubelet_logs import KubeletLogServer, LogStore
from tests.real.kube import eventually as real_eventually

BINARIES = ("etcd", "kube-apiserver")


def bin_dir() -> pathlib.Path:
    """The tools' bin dir without building anything; a missing binary fails and names the command that builds it."""
    path = pathlib.Path(subprocess.run([str(tools.BUILD), "--print"], capture_output=True, text=True,
                                       check=True).stdout.strip())
    missing = [b for b in BINARIES if not (path / b).exists()]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} missing in {path}: build the tools with `{tools.BUILD}` "
                           "(tools/build; minutes when cold, once), then run the tests again")
    return path


def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """tests/real/kube.py's `eventually`, polling faster: nothing here waits on a controller."""
    return real_eventually(check, what, timeout, interval)


class Logs(LogStore):
    def set(self, namespace: str, pod: str, container: str, text: str) -> None:
        """Replace a container's log (what a test's pod printed)."""
        with self._lock:
            self._logs[(namespace, pod, container)] = text.splitlines()


class Terminator:
    """The kubelet's part of a graceful pod deletion: once a bound pod is terminating (deletionTimestamp set by a
    delete or an eviction), delete it with grace period 0 (kubernetes pkg/kubelet/status/status_manager.go
    canBeDeleted -> Delete with GracePeriodSeconds 0 and the pod's UID as precondition)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._watch: Optional[watch.Watch] = None
        self._thread = threading.Thread(target=self._run, name="envtest-terminator", daemon=True)

    def start(self) -> "Terminator":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch:
            self._watch.stop()  # closes the open watch response
        self._thread.join(timeout=10)

    def _finish(self, pod: client.V1Pod) -> None:
        if pod.metadata.deletion_timestamp is None:
            return
        try:
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0,
                                            body=client.V1DeleteOptions(
                                                grace_period_seconds=0,
                                                preconditions=client.V1Preconditions(uid=pod.metadata.uid)))
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces()
                for pod in listed.items:
                    self._finish(pod)
                self._watch = w = watch.Watch()
                if self._stop.is_set():
                    return
                for event in w.stream(self.core.list_pod_for_all_namespaces, timeout_seconds=1,
                                      resource_version=listed.metadata.resource_version):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._finish(event["object"])
                    if self._stop.is_set():
                        w.stop()
            except Exception as e:  # noqa: BLE001 - keep finishing deletions; the session fixture reports errors
                if not self._stop.is_set():
                    self.errors.append(repr(e))
                    self._stop.wait(0.2)


class EnvTest:
    """etcd + kube-apiserver (ControlPlane with no other component), the kubelet log double and the Terminator."""

    def __init__(self) -> None:
        self.workdir = temp_workdir("gpu-migration-envtest-")
        self.logs = Logs()
        self.log_server: Optional[KubeletLogServer] = None
        self.control_plane: Optional[ControlPlane] = None
        self.api: Optional[client.ApiClient] = None
        self.terminator: Optional[Terminator] = None
        self.started_in = 0.0
        self._prefixes = itertools.count(1)

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.control_plane.kubeconfig

    def start(self) -> "EnvTest":
        started = time.monotonic()
        try:
            binaries = bin_dir()
            cert, key = self_signed_cert(self.workdir, "kubelet")
            self.log_server = KubeletLogServer(self.logs, cert, key).start()
            self.control_plane = ControlPlane(self.workdir, binaries, kubelet_port=self.log_server.port,
                                              components=()).start(timeout=60)
            self.api = kconfig.new_client_from_config(str(self.kubeconfig))
            self.terminator = Terminator(kconfig.new_client_from_config(str(self.kubeconfig))).start()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - started
        return self

    def stop(self) -> None:
        if self.terminator:
            self.terminator.stop()
        if self.control_plane:
            for process in self.control_plane.processes:  # a throw-away store: no graceful shutdown to wait for
                if process.popen is not None and process.popen.poll() is None:
                    process.popen.kill()
            self.control_plane.stop()
        if self.log_server:
            self.log_server.stop()
        remove_workdir(self.workdir)

    def next_prefix(self) -> str:
        return f"t{next(self._prefixes)}-"


def _plain(api: client.ApiClient, obj: Any) -> dict:
    return api.sanitize_for_serialization(obj) if not isinstance(obj, dict) else obj


class Kube:
    """One test's view of the shared API server: builders for kwok-style nodes, pods (status through the status
    subresource), ResourceSlices, claims, DeviceClasses, PDBs and events, all named with the test's prefix."""

    def __init__(self, env: EnvTest, prefix: str) -> None:
        self.env, self.prefix = env, prefix
        self.api = env.api
        self.kubeconfig = str(env.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.logs = env.logs
        self.requests: list[tuple[str, str]] = []  # (method, path?query) the code under test sent, see `record`
        self.errors: list[str] = []  # of background helpers (pod runners); teardown fails the test on any
        self._namespaces: set[str] = set()
        self._created: set[str] = set()  # uids of the pods this helper created (pod runners leave them alone)
        self._creating: set[tuple[str, str]] = set()
        self._slice_ids = itertools.count(1)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[watch.Watch] = []

    # --- names -------------------------------------------------------------------------------------------------------
    def name(self, base: str) -> str:
        """A cluster-scoped name for this test (nodes, DeviceClasses, ...)."""
        return f"{self.prefix}{base}"

    def ns(self, base: str) -> str:
        """This test's namespace `base` (created on first use)."""
        name = self.name(base)
        if name not in self._namespaces:
            try:
                self.core.create_namespace({"metadata": {"name": name}})
            except ApiException as e:
                if e.status != 409:
                    raise
            self._namespaces.add(name)
        return name

    # --- nodes ---------------------------------------------------------------------------------------------------------
    def add_node(self, name: str, labels: Optional[dict] = None, allocatable: Optional[dict] = None,
                 kubelet_version: str = "v1.37.0+IKS", ready: bool = True, unschedulable: bool = False,
                 annotations: Optional[dict] = None) -> dict:
        """A kwok-style Node (`name` as given: use `kube.name`), its status written as a kubelet reports it."""
        assert name.startswith(self.prefix), f"node {name} lacks the test's prefix {self.prefix}"
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                             "annotations": {"kwok.x-k8s.io/node": "fake", **(annotations or {})}},
                "spec": {"unschedulable": True} if unschedulable else {}}
        self.core.create_node(body)
        resources = {"cpu": "8", "memory": "32Gi", "pods": "110", **(allocatable or {})}
        return self.patch_node_status(name, {
            "capacity": resources, "allocatable": resources, "nodeInfo": node_info(kubelet_version),
            # A registered kubelet reports Ready (kubernetes pkg/kubelet/nodestatus/setters.go ReadyCondition).
            "conditions": [self._ready_condition(ready)],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            # The API server proxies pods/log here: the kubelet log double.
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.env.log_server.port}}})

    @staticmethod
    def _ready_condition(ready: bool) -> dict:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {"type": "Ready", "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady", "message": "envtest",
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    def node(self, name: str) -> dict:
        return _plain(self.api, self.core.read_node(name))

    def node_or_none(self, name: str) -> Optional[dict]:
        try:
            return self.node(name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def labels(self, name: str) -> dict:
        return self.node(name)["metadata"].get("labels") or {}

    def annotations(self, name: str) -> dict:
        return self.node(name)["metadata"].get("annotations") or {}

    def unschedulable(self, name: str) -> bool:
        return bool(self.node(name)["spec"].get("unschedulable"))

    def allocatable(self, name: str) -> dict:
        return self.node(name)["status"].get("allocatable") or {}

    def patch_node(self, name: str, body: dict) -> None:
        self.core.patch_node(name, body)

    def patch_node_status(self, name: str, status: dict) -> dict:
        return _plain(self.api, self.core.patch_node_status(name, {"status": status}))

    def set_allocatable(self, name: str, resources: dict) -> None:
        """What the kubelet reports when a device plugin (un)registers: capacity and allocatable of a resource
        (a resource mapped to None is removed)."""
        self.patch_node_status(name, {"capacity": resources, "allocatable": resources})

    def set_ready(self, name: str, ready: bool) -> None:
        self.patch_node_status(name, {"conditions": [self._ready_condition(ready)]})

    def cordon(self, name: str, annotations: Optional[dict] = None) -> None:
        self.patch_node(name, {"spec": {"unschedulable": True},
                               **({"metadata": {"annotations": annotations}} if annotations else {})})

    def delete_node(self, name: str) -> None:
        self.core.delete_node(name)

    # --- pods ----------------------------------------------------------------------------------------------------------
    @staticmethod
    def container_status(ready: bool = True, exit_code: Optional[int] = None, waiting: Optional[str] = None,
                         message: Optional[str] = None, name: str = "main") -> dict:
        state: dict = {"running": {"startedAt": "2026-12-02T12:00:00Z"}}
        if exit_code is not None:
            state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}}
        if waiting:
            ready, state = False, {"waiting": {"reason": waiting, **({"message": message} if message else {})}}
        return {"name": name, "image": "img", "imageID": "", "ready": ready, "restartCount": 0, "state": state}

    def add_pod(self, namespace: str, name: str, node: Optional[str] = None, phase: str = "Running",
                requests: Optional[dict] = None, exit_code: Optional[int] = None, ready: bool = True,
                waiting: Optional[str] = None, log: str = "", labels: Optional[dict] = None,
                owner: Optional[dict] = None, resource_claims: Optional[list] = None, container: str = "main",
                **status: Any) -> dict:
        """A pod (bound to `node` if given) whose status the kubelet would have written: `phase`, one container
        (`exit_code`: terminated; `waiting`: a waiting reason), and any further status fields."""
        spec_container: dict = {"name": container, "image": "img",
                           "resources": {"requests": requests or {}, "limits": requests or {}}}
        meta: dict = {"name": name, "namespace": namespace, "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [owner]
        spec: dict = {"containers": [spec_container]}
        if node:
            spec["nodeName"] = node
        if resource_claims:
            spec["resourceClaims"] = resource_claims
            spec_container["resources"]["claims"] = [{"name": c["name"]} for c in resource_claims]
        self._creating.add((namespace, name))
        try:
            created = self.core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod",
                                                                  "metadata": meta, "spec": spec})
            self._created.add(created.metadata.uid)
        finally:
            self._creating.discard((namespace, name))
        pod_status = {"phase": phase, "containerStatuses": [
            self.container_status(ready, exit_code, waiting, name=container)], **status}
        if node and phase == "Running":
            is_ready = ready and not waiting
            pod_status.setdefault("conditions", [{"type": "Ready", "status": "True" if is_ready else "False"}])
        if log:
            self.set_log(namespace, name, log, container)
        return self.set_pod_status(namespace, name, pod_status, pod=created)

    def daemonset_owner(self, name: str = "ds") -> dict:
        return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": str(uuid.uuid4()),
                "controller": True}

    def set_pod_status(self, namespace: str, name: str, status: dict, pod: Any = None) -> dict:
        """Replace the pod's status as the kubelet writes it (the status subresource); `pod`: as last read."""
        body = _plain(self.api, pod if pod is not None else self.core.read_namespaced_pod(name, namespace))
        body["status"] = {**{k: v for k, v in (body.get("status") or {}).items() if k in ("qosClass",)}, **status}
        return _plain(self.api, self.core.replace_namespaced_pod_status(name, namespace, body))

    def update_pod_status(self, namespace: str, name: str, **changes: Any) -> None:
        """Change some status fields, keeping the others."""
        body = _plain(self.api, self.core.read_namespaced_pod(name, namespace))
        body["status"] = {**(body.get("status") or {}), **changes}
        self.core.replace_namespaced_pod_status(name, namespace, body)

    def bind(self, namespace: str, name: str, node: str) -> None:
        """What the scheduler does: the pods/binding subresource."""
        self.core.create_namespaced_pod_binding(name, namespace, {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, _preload_content=False)

    def set_log(self, namespace: str, pod: str, text: str, container: str = "main") -> None:
        self.logs.set(namespace, pod, container, text)

    def append_log(self, namespace: str, pod: str, line: str, container: str = "main") -> None:
        self.logs.append(namespace, pod, container, line)

    def pod(self, namespace: str, name: str) -> dict:
        return _plain(self.api, self.core.read_namespaced_pod(name, namespace))

    def pod_or_none(self, namespace: str, name: str) -> Optional[dict]:
        try:
            return self.pod(namespace, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def pods(self, namespace: str) -> list[dict]:
        return [_plain(self.api, p) for p in self.core.list_namespaced_pod(namespace).items]

    def pod_names(self, namespace: str) -> list[str]:
        return sorted(p.metadata.name for p in self.core.list_namespaced_pod(namespace).items)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        eventually(lambda: self.pod_or_none(namespace, name) is None, f"pod {namespace}/{name} deleted")

    def on_pod_create(self, namespace: str, run: Callable[[dict], None]) -> None:
        """Call `run(pod)` for every pod the code under test creates in `namespace` from now on, in a
        background thread: it plays the scheduler and the kubelet for it (bind, status, logs)."""
        listed = self.core.list_namespaced_pod(namespace)
        seen = {p.metadata.uid for p in listed.items}
        version = listed.metadata.resource_version

        def loop() -> None:
            nonlocal version
            core = client.CoreV1Api(self.api)
            while not self._stop.is_set():
                try:
                    w = watch.Watch()
                    self._watches.append(w)
                    if self._stop.is_set():
                        return
                    for event in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=1,
                                          resource_version=version):
                        pod = event["object"]
                        version = pod.metadata.resource_version
                        if (event["type"] == "ADDED" and pod.metadata.uid not in seen
                                and pod.metadata.uid not in self._created
                                and (namespace, pod.metadata.name) not in self._creating):
                            seen.add(pod.metadata.uid)
                            run(_plain(self.api, pod))
                        if self._stop.is_set():
                            w.stop()
                except Exception as e:  # noqa: BLE001 - reported by teardown
                    if not self._stop.is_set():
                        self.errors.append(f"pod runner in {namespace}: {e!r}")
                        return

        t = threading.Thread(target=loop, name=f"pod-runner-{namespace}", daemon=True)
        t.start()
        self._threads.append(t)

    # --- DRA -----------------------------------------------------------------------------------------------------------
    def add_slice(self, node: str, driver: str, devices: dict[str, str]) -> dict:
        """One node-local resource.k8s.io/v1 ResourceSlice; devices maps device name -> GPU uuid attribute."""
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{driver}-{next(self._slice_ids)}"},
                "spec": {"driver": driver, "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": d, "attributes": {"uuid": {"string": u},
                                                                 "productName": {"string": "NVIDIA A100"}}}
                                     for d, u in devices.items()]}}
        return _plain(self.api, self.resource.create_resource_slice(body))

    def slices(self, node: Optional[str] = None) -> list[dict]:
        selector = f"spec.nodeName={node}" if node else None
        return [_plain(self.api, s) for s in self.resource.list_resource_slice(field_selector=selector).items
                if s.metadata.name.startswith(self.prefix)]

    def delete_slices(self, node: Optional[str] = None) -> None:
        for s in self.slices(node):
            self.resource.delete_resource_slice(s["metadata"]["name"])

    def set_slice_device_uuid(self, name: str, device: str, value: str) -> None:
        body = _plain(self.api, self.resource.read_resource_slice(name))
        for d in body["spec"]["devices"]:
            if d["name"] == device:
                d["attributes"]["uuid"] = {"string": value}
        self.resource.replace_resource_slice(name, body)

    def add_claim(self, namespace: str, name: str, results: list[dict], device_class: str = "gpu.example.com"
                  ) -> dict:
        """A ResourceClaim allocated as the scheduler records it (status.allocation.devices.results)."""
        requests = sorted({r["request"] for r in results}) or ["container-0-request-0"]
        self.resource.create_namespaced_resource_claim(namespace, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": device_class}}
                                              for r in requests]}}})
        self.set_claim_allocation(namespace, name, results)
        return _plain(self.api, self.resource.read_namespaced_resource_claim(name, namespace))

    def set_claim_allocation(self, namespace: str, name: str, results: Optional[list[dict]]) -> None:
        body = _plain(self.api, self.resource.read_namespaced_resource_claim(name, namespace))
        body["status"] = {"allocation": {"devices": {"results": results}}} if results else {}
        self.resource.replace_namespaced_resource_claim_status(name, namespace, body)

    def add_device_class(self, name: str, extended_resource: Optional[str], driver: str = "gpu.nvidia.com") -> dict:
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
        if extended_resource:
            spec["extendedResourceName"] = extended_resource
        return _plain(self.api, self.resource.create_device_class(
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}))

    def device_classes(self) -> list[str]:
        return sorted(c.metadata.name for c in self.resource.list_device_class().items
                      if c.metadata.name.startswith(self.prefix))

    # --- policy, events ------------------------------------------------------------------------------------------------
    def add_pdb(self, namespace: str, name: str, match_labels: dict, disruptions_allowed: int) -> dict:
        """A PodDisruptionBudget whose status says what the disruption controller would have computed."""
        self.policy.create_namespaced_pod_disruption_budget(namespace, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": match_labels}, "minAvailable": 1}})
        self.set_pdb_allowed(namespace, name, disruptions_allowed)
        return _plain(self.api, self.policy.read_namespaced_pod_disruption_budget(name, namespace))

    def set_pdb_allowed(self, namespace: str, name: str, disruptions_allowed: int) -> None:
        body = _plain(self.api, self.policy.read_namespaced_pod_disruption_budget(name, namespace))
        body["status"] = {**(body.get("status") or {}), "disruptionsAllowed": disruptions_allowed,
                          "currentHealthy": 1 + disruptions_allowed, "desiredHealthy": 1,
                          "expectedPods": 1 + disruptions_allowed,
                          # The eviction subresource answers 429 to a budget its controller has not observed yet.
                          "observedGeneration": body["metadata"]["generation"]}
        self.policy.replace_namespaced_pod_disruption_budget_status(name, namespace, body)

    def add_event(self, pod: dict, reason: str, message: str, type_: str = "Warning") -> dict:
        meta = pod["metadata"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return _plain(self.api, self.core.create_namespaced_event(meta["namespace"], {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"], "apiVersion": "v1"},
            "reason": reason, "message": message, "type": type_, "source": {"component": "default-scheduler"},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1}))

    # --- observing the code under test ---------------------------------------------------------------------------------
    def record(self, monkeypatch) -> list[tuple[str, str]]:
        """Record (method, path?query) of every request the code under test sends (any ApiClient but the test's
        own and the Terminator's) into `self.requests`."""
        from kubernetes.client import rest
        real = rest.RESTClientObject.request
        own = {id(self.api.rest_client), id(self.env.terminator.core.api_client.rest_client)}
        requests = self.requests

        def request(rest_self, method, url, *args, **kwargs):
            if id(rest_self) not in own:
                parts = urlsplit(url)
                requests.append((method, parts.path + (f"?{parts.query}" if parts.query else "")))
            return real(rest_self, method, url, *args, **kwargs)

        monkeypatch.setattr(rest.RESTClientObject, "request", request)
        return requests

    @staticmethod
    def after_calls(monkeypatch, owner: Any, attr: str, count: int, change: Callable[[], None]) -> list:
        """Run `change` right after the `count`-th call of `owner.attr` returned (a scenario that evolves while the
        code under test polls, independent of timing); returns the list of calls made."""
        real = getattr(owner, attr)
        calls: list = []

        def spy(*args, **kwargs):
            try:
                return real(*args, **kwargs)
            finally:  # an answer that raises (e.g. a 429) counts too
                calls.append(args)
                if len(calls) == count:
                    change()

        monkeypatch.setattr(owner, attr, spy)
        return calls

    # --- identities ----------------------------------------------------------------------------------------------------
    def identity(self, base: str, rules: list[dict]) -> str:
        """A kubeconfig for a new ServiceAccount `base` bound cluster-wide to a ClusterRole with only `rules` (real
        RBAC: --authorization-mode RBAC), with a bound token from the TokenRequest API."""
        ns, name = self.ns("identities"), self.name(base)
        self.core.create_namespaced_service_account(ns, {"metadata": {"name": base}})
        rbac = client.RbacAuthorizationV1Api(self.api)
        rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
        rbac.create_cluster_role_binding({"metadata": {"name": name}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": base, "namespace": ns}]})
        token = self.core.create_namespaced_service_account_token(
            base, ns, {"spec": {"expirationSeconds": 3600}}).status.token
        cfg = json.loads(pathlib.Path(self.kubeconfig).read_text())
        cfg["users"] = [{"name": base, "user": {"token": token}}]
        for ctx in cfg["contexts"]:
            ctx["context"]["user"] = base
        path = self.env.workdir / f"{name}.kubeconfig"
        write_private(path, json.dumps(cfg))
        return str(path)

    # --- teardown ------------------------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        self._stop.set()
        for w in self._watches:
            w.stop()  # closes the open watch response
        for t in self._threads:
            t.join(timeout=10)
        for ns in self.core.list_namespace().items:
            name = ns.metadata.name
            if not name.startswith(self.prefix):
                continue
            self.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            self.core.delete_collection_namespaced_event(name)
            self.policy.delete_collection_namespaced_pod_disruption_budget(name)
            self.resource.delete_collection_namespaced_resource_claim(name)
            # Without the namespace controller a deleted namespace stays Terminating: finalize it as it would
            # once the namespace is empty.
            self.core.delete_namespace(name)
            body = _plain(self.api, self.core.read_namespace(name))
            body["spec"] = {"finalizers": []}
            self.core.replace_namespace_finalize(name, body)
        for n in self.core.list_node().items:
            if n.metadata.name.startswith(self.prefix):
                self.core.delete_node(n.metadata.name)
        for s in self.resource.list_resource_slice().items:
            if s.metadata.name.startswith(self.prefix) or (s.spec.node_name or "").startswith(self.prefix):
                self.resource.delete_resource_slice(s.metadata.name)
        for c in self.resource.list_device_class().items:
            if c.metadata.name.startswith(self.prefix):
                self.resource.delete_device_class(c.metadata.name)
        rbac = client.RbacAuthorizationV1Api(self.api)
        for b in rbac.list_cluster_role_binding().items:
            if b.metadata.name.startswith(self.prefix):
                rbac.delete_cluster_role_binding(b.metadata.name)
        for r in rbac.list_cluster_role().items:
            if r.metadata.name.startswith(self.prefix):
                rbac.delete_cluster_role(r.metadata.name)


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
