"""Records every state of the cluster's Nodes, Pods and ResourceSlices while a test runs, through Kubernetes watches,
so a test can assert what happened in between (a label that came and went, a pod that ran and was deleted, the order
of a node's changes) rather than only the end state.

Each state carries its resourceVersion (`rv`). KEP-5504 (stable in 1.35) makes versions comparable within one
resource; here every resource lives in the one etcd, whose revision is every object's resourceVersion
(k8s.io/apiserver pkg/storage/etcd3 APIObjectVersioner), so `rv` also orders a Node's change against a Pod's or a
ResourceSlice's. That holds for this local control plane, not for every API server."""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from kubernetes import client, config as kconfig, watch
from kubernetes.client.exceptions import ApiException


@dataclass(frozen=True)
class NodeState:
    rv: int
    event: str  # LISTED (already there when recording started), ADDED, MODIFIED, DELETED
    name: str
    labels: dict
    annotations: dict
    unschedulable: bool
    kubelet: str
    allocatable: dict  # status.allocatable: what the device plugin offers shows here


@dataclass(frozen=True)
class PodState:
    rv: int
    event: str
    namespace: str
    name: str
    node: Optional[str]
    phase: Optional[str]
    owner: str  # kind of the controlling owner (DaemonSet, ReplicaSet, ...), '' if none


@dataclass(frozen=True)
class SliceState:
    rv: int
    event: str
    name: str
    node: str
    driver: str


def _slice(event: str, s: dict) -> SliceState:
    spec = s["spec"]
    return SliceState(int(s["metadata"]["resourceVersion"]), event, s["metadata"]["name"], spec.get("nodeName", ""),
                      spec.get("driver", ""))


def _node(event: str, n: client.V1Node) -> NodeState:
    info = n.status.node_info if n.status else None
    meta = n.metadata
    return NodeState(int(meta.resource_version), event, meta.name, dict(meta.labels or {}),
                     dict(meta.annotations or {}), bool(n.spec.unschedulable), info.kubelet_version if info else "",
                     dict((n.status.allocatable if n.status else None) or {}))


def _pod(event: str, p: client.V1Pod) -> PodState:
    owner = next((r.kind for r in p.metadata.owner_references or [] if r.controller), "")
    return PodState(int(p.metadata.resource_version), event, p.metadata.namespace, p.metadata.name, p.spec.node_name,
                    p.status.phase if p.status else None, owner)


class Recorder:
    def __init__(self, kubeconfig: str) -> None:
        self.api = kconfig.new_client_from_config(str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.nodes: list[NodeState] = []
        self.pods: list[PodState] = []
        self.slices: list[SliceState] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> "Recorder":
        slices = functools.partial(client.CustomObjectsApi(self.api).list_cluster_custom_object,
                                   "resource.k8s.io", "v1", "resourceslices")
        slices.__name__ = "list_resource_slices"
        for lister, out, convert in ((self.core.list_node, self.nodes, _node),
                                     (self.core.list_pod_for_all_namespaces, self.pods, _pod),
                                     (slices, self.slices, _slice)):
            listed = lister()
            items, rv = (listed["items"], listed["metadata"]["resourceVersion"]) if isinstance(listed, dict) else \
                (listed.items, listed.metadata.resource_version)
            out.extend(convert("LISTED", item) for item in items)
            t = threading.Thread(target=self._watch, args=(lister, out, convert, rv), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _watch(self, lister: Callable, out: list, convert: Callable, rv: str) -> None:
        while not self._stop.is_set():
            try:
                # Short server-side timeouts so stop() is noticed; each new watch resumes at the last version seen.
                for e in watch.Watch().stream(lister, resource_version=rv, timeout_seconds=1,
                                              allow_watch_bookmarks=True):
                    obj = e["object"]
                    rv = obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version
                    if e["type"] != "BOOKMARK":
                        out.append(convert(e["type"], obj))
            except ApiException as e:  # 410 Gone would mean a gap in the record: the test must not trust it
                self.errors.append(f"{lister.__name__}: {e.status} {e.reason}")
                return

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        assert not self.errors, f"the cluster record has gaps: {self.errors}"

    def pod(self, namespace: str, prefix: str) -> list[PodState]:
        return [s for s in self.pods if s.namespace == namespace and s.name.startswith(prefix)]

    def of_node(self, name: str) -> list[NodeState]:
        return [s for s in self.nodes if s.name == name]

    def offers(self, node: str, resource: str) -> list[tuple[int, int, int]]:
        """(rv, GPUs the device plugin offers as `resource`, ResourceSlices published for the node) after every
        recorded change of the node or its slices, in order: the two paths' offers at each moment."""
        changes = sorted([(s.rv, "node", s) for s in self.nodes if s.name == node]
                         + [(s.rv, "slice", s) for s in self.slices if s.node == node], key=lambda c: c[0])
        plugin, slices, out = 0, set(), []
        for rv, kind, s in changes:
            if kind == "node":
                plugin = int(s.allocatable.get(resource, "0"))
            elif s.event == "DELETED":
                slices.discard(s.name)
            else:
                slices.add(s.name)
            out.append((rv, plugin, len(slices)))
        return out

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
