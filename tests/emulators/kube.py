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
        self.openapi: dict[str, dict] = {RESOURCE_V1: openapi_resource_v1()}
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
                                       # The kubelet reports NodeReady (k8s.io/api core/v1 types.go NodeConditionType)
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
            status, payload = self.handle(method, url.path, query, body, content_type)
            payload = copy.deepcopy(payload)  # the response as served, before triggers (or other requests) change it
            self._fire(raw_path)
        return status, payload

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, content_type: str):
        """Return (status, JSON-able or str). Routes are matched in order."""
        selector = query.get("fieldSelector", "")
        for pattern, verb, action in self._routes():
            m = re.fullmatch(pattern, path)
            if m and verb == method:
                return action(*m.groups(), selector=selector, body=body, content_type=content_type)
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
            (ns + r"/events", "GET", lambda n, **k: self._list(
                "EventList", [e for e in self.events if e["metadata"]["namespace"] == n], k["selector"])),
            (r"/apis/resource.k8s.io/v1/resourceslices", "GET",
             lambda **k: self._list("ResourceSliceList", self.slices, k["selector"])),
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

    def _delete_pod(self, namespace, name, **_):
        pod = self.pods.pop((namespace, name), None)
        return (200, pod) if pod else (404, _status(404, f'pods "{name}" not found'))

    def _log(self, namespace, name, **_):
        if (namespace, name) not in self.pods:
            return 404, _status(404, f'pods "{name}" not found')
        return 200, self.logs.get((namespace, name), "")


def _status(code: int, message: str) -> dict:
    reasons = {404: "NotFound", 409: "AlreadyExists", 415: "UnsupportedMediaType"}
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": reasons.get(code, "BadRequest"), "message": message}
