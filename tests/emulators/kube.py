"""A local Kubernetes API emulator: real HTTP + JSON on 127.0.0.1, serving only what iks_gpu_migration.kube_* use.

Tests set the scenario by editing the dicts (nodes, pods, logs, events, slices, claims, openapi), change it
while the code polls with `after(n, path_part, change)`, and may hook `on_pod_create(pod)` to "run" pods the code
under test creates. Builders below make minimal valid objects.
"""
import copy
import itertools
import json
import re
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

from tests.emulators.http import LocalServer

RESOURCE_V1 = "apis/resource.k8s.io/v1"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; also what strategic merge does for the maps/scalars patched here."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def field_value(obj: dict, path: str) -> str:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def matches(obj: dict, field_selector: str) -> bool:
    """fieldSelector with `a.b=c`, `a.b==c` and `a.b!=c` terms joined by commas."""
    for term in filter(None, field_selector.split(",")):
        key, op, value = re.match(r"([^=!]+)(!=|==|=)(.*)", term).groups()
        if (field_value(obj, key) == value) != (op != "!="):
            return False
    return True


def labels_match(obj: dict, label_selector: str) -> bool:
    """Equality-based labelSelector `k=v` / `k==v` / `k!=v` and existence `k` / `!k` terms joined by commas
    (apimachinery labels.Parse)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, label_selector.split(",")):
        if not re.search(r"[=!]", term.lstrip("!")):  # existence: `k` has the label, `!k` has not
            if (term.lstrip("!") in labels) == term.startswith("!"):
                return False
            continue
        key, op, value = re.match(r"([^=!]+)(!=|==|=)(.*)", term).groups()
        if (labels.get(key) == value) != (op != "!="):
            return False
    return True


def openapi_resource_v1(extended_resource_name: bool = True) -> dict:
    props = {"selectors": {"type": "array"}, "config": {"type": "array"}}
    if extended_resource_name:
        props["extendedResourceName"] = {"type": "string"}
    return {"openapi": "3.0.0", "components": {"schemas": {
        "io.k8s.api.resource.v1.DeviceClassSpec": {"type": "object", "properties": props}}}}


def node_info(kubelet_version: str) -> dict:
    """status.nodeInfo with every field the client's model requires."""
    fields = ("architecture", "bootID", "containerRuntimeVersion", "kernelVersion", "kubeProxyVersion",
              "machineID", "operatingSystem", "osImage", "systemUUID")
    return {**{f: "emulated" for f in fields}, "kubeletVersion": kubelet_version}


class KubeEmulator:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.events: list[dict] = []
        self.slices: list[dict] = []
        self.claims: dict[tuple[str, str], dict] = {}
        self.namespaces: set[str] = set()
        self.pdbs: dict[tuple[str, str], dict] = {}  # PodDisruptionBudgets, consulted by the eviction subresource
        self.openapi: dict[str, dict] = {RESOURCE_V1: openapi_resource_v1()}
        self.device_classes: dict[str, dict] = {}
        # An API server with the DRAExtendedResource gate off serves the field in OpenAPI but drops it from
        # DeviceClasses it stores (kubernetes pkg/registry/resource/deviceclass/strategy.go,
        # dropDisabledDRAExtendedResourceFields).
        self.stores_extended_resource_name = True
        # Controllers that react to every request (e.g. GpuNodeModel), run under the lock after each one.
        self.controllers: list[Callable[[str, str], None]] = []
        self.on_pod_create: Optional[Callable[[dict], None]] = None
        self.requests: list[tuple[str, str]] = []  # (method, path?query) served, for assertions
        self._triggers: list[list] = []  # [path part, requests left, change]
        self._ids = itertools.count(1)
        self._server: Optional[LocalServer] = None

    # --- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> "KubeEmulator":
        self._server = LocalServer(self._serve, methods=("GET", "POST", "PATCH", "DELETE"), poll_interval=0.02)
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.stop()

    @property
    def url(self) -> str:
        return self._server.url

    def write_kubeconfig(self, path: Path) -> str:
        """A kubeconfig (JSON is YAML) with a bearer token pointing at this emulator."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
        }
        Path(path).write_text(json.dumps(config))
        return str(path)

    def after(self, count: int, path_part: str, change: Callable[[], None]) -> None:
        """Apply `change` once `count` requests whose path contains `path_part` were served (a scenario that evolves
        while the code under test polls, independent of timing)."""
        self._triggers.append([path_part, count, change])

    def _fire(self, path: str) -> None:
        for trigger in list(self._triggers):
            if trigger[0] in path:
                trigger[1] -= 1
                if trigger[1] <= 0:
                    self._triggers.remove(trigger)
                    trigger[2]()

    # --- scenario builders ---------------------------------------------------------------------------------------
    def add_node(self, name: str, labels: Optional[dict] = None, allocatable: Optional[dict] = None,
                 kubelet_version: str = "v1.37.0+IKS", ready: bool = True) -> dict:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": str(uuid.uuid4()), "labels": {"kubernetes.io/hostname": name,
                                                                               **(labels or {})}},
                "spec": {}, "status": {"allocatable": {"cpu": "8", **(allocatable or {})},
                                       "nodeInfo": node_info(kubelet_version),
                                       # A registered kubelet reports Ready (kubernetes pkg/kubelet/nodestatus/
                                       # setters.go ReadyCondition); the path switch and the capacity gates read it.
                                       "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                       "reason": "KubeletReady" if ready else "KubeletNotReady"}]}}
        self.nodes[name] = node
        return node

    def add_pod(self, namespace: str, name: str, node: Optional[str] = None, phase: str = "Running",
                requests: Optional[dict] = None, exit_code: Optional[int] = None, ready: bool = True,
                waiting: Optional[str] = None, log: str = "", **status: Any) -> dict:
        container_status: dict[str, Any] = {"name": "main", "image": "img", "imageID": "", "ready": ready,
                                            "restartCount": 0, "state": {"running": {}}}
        if exit_code is not None:
            reason = "Completed" if exit_code == 0 else "Error"
            container_status["state"] = {"terminated": {"exitCode": exit_code, "reason": reason}}
        if waiting:
            container_status.update(ready=False, state={"waiting": {"reason": waiting}})
        resources = {"requests": requests or {}, "limits": requests or {}}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
               "spec": {"nodeName": node, "containers": [{"name": "main", "image": "img", "resources": resources}]},
               "status": {"phase": phase, "containerStatuses": [container_status], **status}}
        if node is None:
            del pod["spec"]["nodeName"]
        self.pods[(namespace, name)] = pod
        self.logs[(namespace, name)] = log
        return pod

    def add_slice(self, node: str, driver: str, devices: dict[str, str]) -> dict:
        """One node-local slice; devices maps device name -> GPU uuid attribute."""
        sl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
              "metadata": {"name": f"{node}-{driver}-{next(self._ids)}"},
              "spec": {"driver": driver, "nodeName": node,
                       "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                       "devices": [{"name": d, "attributes": {"uuid": {"string": u},
                                                               "productName": {"string": "NVIDIA A100"}}}
                                   for d, u in devices.items()]}}
        self.slices.append(sl)
        return sl

    def add_claim(self, namespace: str, name: str, results: list[dict]) -> dict:
        """results: [{driver, pool, device, request}] as in status.allocation.devices.results."""
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
                 "spec": {"devices": {"requests": []}},
                 "status": {"allocation": {"devices": {"results": results}}}}
        self.claims[(namespace, name)] = claim
        return claim

    def add_pdb(self, namespace: str, name: str, match_labels: dict, disruptions_allowed: int) -> dict:
        """status.disruptionsAllowed is what the disruption controller computed; eviction decrements it."""
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"selector": {"matchLabels": match_labels}},
               "status": {"disruptionsAllowed": disruptions_allowed}}
        self.pdbs[(namespace, name)] = pdb
        return pdb

    def add_event(self, pod: dict, reason: str, message: str, type_: str = "Warning") -> dict:
        meta = pod["metadata"]
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": f"{meta['name']}.{next(self._ids)}", "namespace": meta["namespace"]},
                 "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                                    "uid": meta["uid"]},
                 "reason": reason, "message": message, "type": type_}
        self.events.append(event)
        return event

    # --- API -------------------------------------------------------------------------------------------------------
    def _serve(self, method: str, raw_path: str, headers, raw_body: bytes) -> tuple[int, Any]:
        """One HTTP request: recorded, handled and its hooks fired under the lock."""
        url = urlsplit(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = json.loads(raw_body) if raw_body else None
        content_type = (headers.get("Content-Type") or "").split(";")[0]
        with self.lock:
            self.requests.append((method, raw_path))
            status, payload = self.handle(method, url.path, query, body, content_type, dry_run=query.get("dryRun"))
            payload = copy.deepcopy(payload)  # the response as served, before triggers (or other requests) change it
            self._fire(raw_path)
            for controller in self.controllers:
                controller(method, raw_path)
        return status, payload

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, content_type: str,
               dry_run: Optional[str] = None):
        """Return (status, JSON-able or str). Routes are matched in order."""
        selector = query.get("fieldSelector", "")
        for pattern, verb, action in self._routes():
            m = re.fullmatch(pattern, path)
            if m and verb == method:
                extra = {"dry_run": dry_run} if action == self._create_device_class else {}
                status, payload = action(*m.groups(), selector=selector, body=body, content_type=content_type,
                                         **extra)
                if query.get("labelSelector") and isinstance(payload, dict) and "items" in payload:
                    payload = {**payload, "items": [i for i in payload["items"]
                                                    if labels_match(i, query["labelSelector"])]}
                return status, payload
        return 404, _status(404, f"no route for {method} {path}")

    def _routes(self):
        ns = r"/api/v1/namespaces/([^/]+)"
        return [
            (r"/openapi/v3", "GET", self._openapi_index),
            (r"/openapi/v3/(.+)", "GET", self._openapi_doc),
            (r"/api/v1/nodes", "GET", lambda **k: self._list("NodeList", self.nodes.values(), k["selector"])),
            (r"/api/v1/nodes/([^/]+)", "GET", lambda name, **k: self._get(self.nodes, name, "nodes")),
            (r"/api/v1/nodes/([^/]+)", "PATCH", self._patch_node),
            (r"/api/v1/namespaces", "POST", self._create_namespace),
            (r"/api/v1/pods", "GET", lambda **k: self._list("PodList", self.pods.values(), k["selector"])),
            (ns + r"/pods", "GET", lambda n, **k: self._list("PodList", self._in(self.pods, n), k["selector"])),
            (ns + r"/pods", "POST", self._create_pod),
            (ns + r"/pods/([^/]+)", "GET", lambda n, name, **k: self._get(self.pods, (n, name), "pods")),
            (ns + r"/pods/([^/]+)", "DELETE", self._delete_pod),
            (ns + r"/pods/([^/]+)/log", "GET", self._log),
            (ns + r"/pods/([^/]+)/eviction", "POST", self._evict),
            (ns + r"/events", "GET", lambda n, **k: self._list(
                "EventList", [e for e in self.events if e["metadata"]["namespace"] == n], k["selector"])),
            (r"/apis/resource.k8s.io/v1/resourceslices", "GET",
             lambda **k: self._list("ResourceSliceList", self.slices, k["selector"])),
            (r"/apis/resource.k8s.io/v1/deviceclasses", "GET",
             lambda **k: self._list("DeviceClassList", self.device_classes.values(), k["selector"])),
            (r"/apis/resource.k8s.io/v1/deviceclasses", "POST", self._create_device_class),
            (r"/apis/resource.k8s.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)", "GET",
             lambda n, name, **k: self._get(self.claims, (n, name), "resourceclaims.resource.k8s.io")),
        ]

    def _openapi_index(self, **_):
        urls = {p: {"serverRelativeURL": f"/openapi/v3/{p}?hash=0123456789ABCDEF"} for p in self.openapi}
        return 200, {"paths": urls}

    def _openapi_doc(self, path, **_):
        return (200, self.openapi[path]) if path in self.openapi else (404, _status(404, f"no OpenAPI for {path}"))

    @staticmethod
    def _in(store: dict, namespace: str):
        return [obj for (n, _), obj in store.items() if n == namespace]

    @staticmethod
    def _list(kind: str, items, selector: str):
        return 200, {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"},
                     "items": [i for i in items if matches(i, selector)]}

    @staticmethod
    def _get(store: dict, key, resource: str):
        if key not in store:
            name = key[1] if isinstance(key, tuple) else key
            return 404, _status(404, f'{resource} "{name}" not found')
        return 200, store[key]

    def _patch_node(self, name, body, content_type, **_):
        if name not in self.nodes:
            return 404, _status(404, f'nodes "{name}" not found')
        if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return 415, _status(415, f"unsupported patch type {content_type}")
        self.nodes[name] = merge_patch(self.nodes[name], body)
        return 200, self.nodes[name]

    def _create_namespace(self, body, **_):
        name = body["metadata"]["name"]
        if name in self.namespaces:
            return 409, _status(409, f'namespaces "{name}" already exists')
        self.namespaces.add(name)
        return 201, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}

    def _create_pod(self, namespace, body, **_):
        meta = body.setdefault("metadata", {})
        meta.setdefault("name", f"{meta.get('generateName', 'pod-')}{next(self._ids):05d}")
        meta.update(namespace=namespace, uid=str(uuid.uuid4()))
        if (namespace, meta["name"]) in self.pods:
            return 409, _status(409, f'pods "{meta["name"]}" already exists')
        body["status"] = {"phase": "Pending"}
        self.pods[(namespace, meta["name"])] = body
        self.logs[(namespace, meta["name"])] = ""
        if self.on_pod_create:
            self.on_pod_create(body)
        return 201, body

    def _create_device_class(self, body, dry_run=None, **_):
        """Create, or with dryRun=All only validate and return what would be stored (nothing persisted)."""
        stored = copy.deepcopy(body)
        name = stored["metadata"]["name"]
        if name in self.device_classes:
            return 409, _status(409, f'deviceclasses.resource.k8s.io "{name}" already exists')
        stored["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp="2026-12-02T12:00:00Z")
        if not self.stores_extended_resource_name:
            stored.get("spec", {}).pop("extendedResourceName", None)
        if dry_run != "All":
            self.device_classes[name] = stored
        return 201, stored

    def add_device_class(self, name: str, extended_resource: Optional[str], driver: str = "gpu.nvidia.com") -> dict:
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
        if extended_resource:
            spec["extendedResourceName"] = extended_resource
        self.device_classes[name] = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                     "metadata": {"name": name, "uid": str(uuid.uuid4())}, "spec": spec}
        return self.device_classes[name]

    def _delete_pod(self, namespace, name, **_):
        pod = self.pods.pop((namespace, name), None)
        return (200, pod) if pod else (404, _status(404, f'pods "{name}" not found'))

    def _evict(self, namespace, name, body, **_):
        """The pods/eviction subresource as kubernetes pkg/registry/core/pod/storage/eviction.go serves it: a
        finished pod is deleted without a budget check; more than one matching PDB is a 500; a PDB with
        disruptionsAllowed 0 answers 429 TooManyRequests (cause DisruptionBudget); otherwise the budget is
        decremented and the pod deleted (201, Status Success)."""
        if (body or {}).get("kind") != "Eviction":
            return 400, _status(400, "Eviction body expected")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return 404, _status(404, f'pods "{name}" not found')
        if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            labels = pod["metadata"].get("labels") or {}
            pdbs = [p for (n, _), p in self.pdbs.items() if n == namespace and all(
                labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())]
            if len(pdbs) > 1:
                return 500, _status(500, "This pod has more than one PodDisruptionBudget, which the eviction "
                                         "subresource does not support.")
            if pdbs and pdbs[0]["status"]["disruptionsAllowed"] <= 0:
                status = _status(429, "Cannot evict pod as it would violate the pod's disruption budget.")
                status["details"] = {"causes": [{"reason": "DisruptionBudget", "message": (
                    f"The disruption budget {pdbs[0]['metadata']['name']} needs 1 healthy pods and has 1 currently")}]}
                return 429, status
            if pdbs:
                pdbs[0]["status"]["disruptionsAllowed"] -= 1
        self.pods.pop((namespace, name))
        return 201, {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}

    def _log(self, namespace, name, **_):
        if (namespace, name) not in self.pods:
            return 404, _status(404, f'pods "{name}" not found')
        return 200, self.logs.get((namespace, name), "")


def _status(code: int, message: str) -> dict:
    reasons = {404: "NotFound", 409: "AlreadyExists", 415: "UnsupportedMediaType", 429: "TooManyRequests",
               500: "InternalError"}
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": reasons.get(code, "BadRequest"), "message": message}


DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"


class GpuNodeModel:
    """What one GPU node's NVIDIA components and kubelet do in answer to its labels, after every API request:

    - GPU Operator device plugin: its DaemonSet selects `nvidia.com/gpu.deploy.device-plugin: "true"`; any value but
      "false" is treated as on here (NVIDIA/gpu-operator assets/state-device-plugin/0500_daemonset.yaml; an existing
      value is honoured, controllers/state_manager.go). While it runs, the kubelet reports the GPUs as allocatable.
    - Kubelet: when the plugin's endpoint stops, allocatable drops to 0 at once and capacity stays 0, not absent
      (kubernetes pkg/kubelet/cm/devicemanager, pkg/kubelet/nodestatus/setters.go).
    - DRA kubelet plugin (pinned by the chart's kubeletPlugin.nodeSelector to the pilot label): publishes one
      ResourceSlice with the node's GPUs and runs pod `nvidia-dra-driver-gpu-kubelet-plugin-<node>`. When the label
      goes, the pod goes at once, and the kubelet wipes the slices some time later (~30 s after unregistration,
      pkg/kubelet/cm/dra): here after `wipe_after` more API requests.

    After every request it records a violation if the node offers GPUs on both paths: device-plugin allocatable > 0
    while DRA devices are published, or DRA devices published while a pod holds a GPU through the device plugin
    (the scheduler uses DRA on a node whose allocatable is 0, so that GPU would go to a second pod: KEP-5004).
    """

    def __init__(self, kube: KubeEmulator, node: str, gpus: dict[str, str], pilot: tuple[str, str],
                 resource: str = "nvidia.com/gpu", driver: str = "gpu.nvidia.com",
                 dra_namespace: str = "nvidia-dra-driver-gpu", wipe_after: int = 3) -> None:
        self.kube, self.node, self.gpus, self.pilot = kube, node, gpus, pilot
        self.resource, self.driver, self.dra_namespace, self.wipe_after = resource, driver, dra_namespace, wipe_after
        self.violations: list[str] = []
        self.requests_seen = 0
        self._wipe_in: Optional[int] = None
        kube.controllers.append(self.react)
        self.react("INIT", "")

    def _slices(self) -> list[dict]:
        return [s for s in self.kube.slices if s["spec"]["nodeName"] == self.node and s["spec"]["driver"] == self.driver]

    def plugin_pods_holding(self) -> list[str]:
        return sorted(
            f"{ns}/{name}" for (ns, name), p in self.kube.pods.items()
            if p["spec"].get("nodeName") == self.node and p["status"].get("phase") not in ("Succeeded", "Failed")
            and not p["status"].get("extendedResourceClaimStatus")
            and any(self.resource in (c.get("resources") or {}).get("limits", {}) for c in p["spec"]["containers"])
        )

    def react(self, method: str, path: str) -> None:
        self.requests_seen += 1
        node = self.kube.nodes.get(self.node)
        if node is None:
            return
        labels = node["metadata"].get("labels") or {}
        allocatable = node["status"].setdefault("allocatable", {})
        allocatable[self.resource] = str(len(self.gpus)) if labels.get(DEVICE_PLUGIN_LABEL) != "false" else "0"
        plugin_pod = (self.dra_namespace, f"nvidia-dra-driver-gpu-kubelet-plugin-{self.node}")
        if labels.get(self.pilot[0]) == self.pilot[1]:
            self._wipe_in = None
            if not self._slices():
                self.kube.add_slice(self.node, self.driver, self.gpus)
            if plugin_pod not in self.kube.pods:
                pod = self.kube.add_pod(*plugin_pod, node=self.node)
                # A DaemonSet pod (NVIDIA/k8s-dra-driver-gpu deployments/helm/dra-driver-nvidia-gpu/templates/
                # kubeletplugin.yaml), so an eviction (node_eviction) leaves it alone as kubectl drain does.
                pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                       "name": "nvidia-dra-driver-gpu-kubelet-plugin",
                                                       "uid": "uid-kubelet-plugin", "controller": True}]
        else:
            self.kube.pods.pop(plugin_pod, None)
            if self._slices():
                self._wipe_in = self.wipe_after if self._wipe_in is None else self._wipe_in - 1
                if self._wipe_in <= 0:
                    self.kube.slices[:] = [s for s in self.kube.slices if s not in self._slices()]
                    self._wipe_in = None
        self.check(f"{method} {path}")

    def check(self, after: str) -> None:
        if not self._slices():
            return
        if int(self.kube.nodes[self.node]["status"]["allocatable"].get(self.resource, "0")) > 0:
            self.violations.append(f"after {after}: {self.resource} allocatable and DRA devices published")
        for pod in self.plugin_pods_holding():
            self.violations.append(f"after {after}: {pod} holds a GPU through the device plugin while DRA publishes it")
