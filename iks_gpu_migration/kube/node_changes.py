"""A wait on one node, woken by the API server's watch when the node, its pods or its ResourceSlices change, as
`kubectl wait` is (k8s.io/kubectl/pkg/cmd/wait: list for a resourceVersion, then watch from it), instead of a whole
poll interval after the change.

The waits still poll (common/waiting.py wait_for): a wake only makes the next poll come sooner, so a watch that
breaks, lags or is refused costs the poll interval, never a result. With pollInterval 15 s, a batch's readiness was
seen on average 7.5 s after the last new node offered its GPUs; a wake makes that the time of one request.

Connections: one watch of Nodes and one of ResourceSlices per kubeconfig in the provider process, shared by every
wait (each event wakes the waits on the node it names); and one watch per waiting node of the pods bound to it
(fieldSelector spec.nodeName, the kubelet's own watch, indexed in the API server's watch cache), so a busy cluster's
other pods never reach this process. A watch runs while anyone waits on it and ends within WATCH_SECONDS after.
Watches hold their connections on a pool of their own (kube/clients.py watch_client), apart from the requests'.
A watch's reads time out WATCH_READ_MARGIN after its server-side end (the requests' READ_TIMEOUT would do for 20 s,
but says nothing of a watch): a connection gone half-open mid-watch ends it then, and it is started again.
"""
import contextlib
import json
import threading
from typing import Callable, Iterator, Optional

import pulumi
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from ..common.waiting import sleep_until_set, shutting_down
from .clients import CONNECT_TIMEOUT, watch_client
from .refusals import ROLE_FILE, ROLE_NAME, refusal

WATCH_SECONDS = 20  # a watch request ends after this (server side), so one that nobody listens to any more stops
WATCH_READ_MARGIN = 15  # no byte for WATCH_SECONDS + this: the server's end never came, the connection is dead
RETRY_SECONDS = 1.0  # after a failed watch, doubling up to 30 s; meanwhile the waits poll at their interval
SETTLE = 0.1  # after a wake, the changes that come with it (a node's operand pods) are read by one poll


def _node_of(kind: str, obj: dict) -> Optional[str]:
    if kind == "nodes":
        return (obj.get("metadata") or {}).get("name")
    return (obj.get("spec") or {}).get("nodeName")  # Pod and ResourceSlice (resource.k8s.io/v1) alike


def _lister(api, kind: str, node: Optional[str]) -> Callable:
    if kind == "nodes":
        return client.CoreV1Api(api).list_node
    if kind == "resourceslices":
        return client.ResourceV1Api(api).list_resource_slice
    core = client.CoreV1Api(api)
    return lambda **kw: core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", **kw)


class _Watch:
    """One watch of one collection (every Node, every ResourceSlice, or one node's pods) while anyone listens: each
    event sets the Events of the listeners of the node it names."""

    def __init__(self, kubeconfig: Optional[str], kind: str, node: Optional[str] = None) -> None:
        self.kubeconfig, self.kind, self.node = kubeconfig, kind, node
        self.lock = threading.Lock()
        self.listeners: dict[str, set[threading.Event]] = {}
        self.running = False
        self.failures = 0

    def add(self, node: str, event: threading.Event) -> None:
        with self.lock:
            self.listeners.setdefault(node, set()).add(event)
            if not self.running and not _refused(self.kubeconfig, self.kind):
                self.running = True
                threading.Thread(target=self._run, name=f"watch-{self.kind}", daemon=True).start()

    def remove(self, node: str, event: threading.Event) -> None:
        with self.lock:
            events = self.listeners.get(node, set())
            events.discard(event)
            if not events:
                self.listeners.pop(node, None)

    def _wake(self, node: Optional[str]) -> None:
        with self.lock:
            for event in self.listeners.get(node, ()):
                event.set()

    def _idle(self) -> bool:
        with self.lock:
            if self.listeners and not shutting_down():
                return False
            self.running = False
            return True

    def _run(self) -> None:
        version: Optional[str] = None
        while not self._idle():
            try:
                version = self._watch(version)
                self.failures = 0
            except Exception as e:  # noqa: BLE001 - the waits go on polling; the watch is tried again
                if _refuse(self.kubeconfig, self.kind, e):  # RBAC: asking again would only be refused again
                    with self.lock:
                        self.running = False
                    return
                version, self.failures = None, self.failures + 1
                threading.Event().wait(min(RETRY_SECONDS * 2 ** (self.failures - 1), 30))

    def _watch(self, version: Optional[str]) -> Optional[str]:
        """One watch request from `version` (a fresh list's when None); returns where to resume, None to list again."""
        lister = _lister(watch_client(self.kubeconfig), self.kind, self.node)
        if version is None:  # only the list's resourceVersion is needed: the waits read the objects themselves
            version = lister(limit=1).metadata.resource_version
        response = lister(watch=True, resource_version=version, allow_watch_bookmarks=True,
                          timeout_seconds=WATCH_SECONDS, _preload_content=False,
                          _request_timeout=(CONNECT_TIMEOUT, WATCH_SECONDS + WATCH_READ_MARGIN))
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line) if line.strip() else None
                if not event:
                    continue
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":  # 410 Gone: too old to resume from; list again
                    return None
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if event.get("type") != "BOOKMARK":
                    self._wake(_node_of(self.kind, obj))
                if not self.listeners:  # nobody left: _run stops it (read without the lock: a hint only)
                    break
        finally:  # closed, not returned half-read to the pool (as kubernetes' Watch.stream does)
            response.close()
            response.release_conn()
        return version


_REFUSED: set[tuple[str, str]] = set()  # (kubeconfig, kind) whose watch RBAC refused: not asked again in this process
_REFUSED_LOCK = threading.Lock()


def _refused(kubeconfig: Optional[str], kind: str) -> bool:
    return (kubeconfig or "", kind) in _REFUSED


def _refuse(kubeconfig: Optional[str], kind: str, error: BaseException) -> bool:
    """An RBAC refusal of the list or the watch (HTTP 403): said once per kubeconfig and kind, naming what the role
    lacks; the waits then only poll. Any other failure is retried with back-off."""
    message = refusal(error)
    if message is None:
        return False
    key = (kubeconfig or "", kind)
    with _REFUSED_LOCK:
        first = key not in _REFUSED
        _REFUSED.add(key)
    if first:
        pulumi.log.warn(f"watching {kind} was refused ({message}): the waits poll instead, each change is seen up to a "
                        f"poll interval later; grant list and watch on {kind} ({ROLE_FILE}, ClusterRole {ROLE_NAME})")
    return True


class _Watches:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[tuple, _Watch] = {}

    def get(self, kubeconfig: Optional[str], kind: str, node: Optional[str] = None) -> _Watch:
        with self.lock:  # a watch that stopped is started again by its next listener (_Watch.add)
            return self.by_key.setdefault((kubeconfig or "", kind, node), _Watch(kubeconfig, kind, node))


WATCHES = _Watches()


@contextlib.contextmanager
def woken_by_changes(kubeconfig: Optional[str], node: str, slices: bool = False) -> Iterator[Callable[[float], None]]:
    """`with woken_by_changes(kubeconfig, node) as sleep: wait_for(..., sleep=sleep)`: the wait's sleep ends early
    when the node, a pod bound to it or (slices=True) one of its ResourceSlices changes."""
    event = threading.Event()
    watches = [WATCHES.get(kubeconfig, "nodes"), WATCHES.get(kubeconfig, "pods", node)]
    if slices:
        watches.append(WATCHES.get(kubeconfig, "resourceslices"))
    for watch in watches:
        watch.add(node, event)
    try:
        yield lambda seconds: sleep_until_set(event, seconds, SETTLE)
    finally:
        for watch in watches:
            watch.remove(node, event)
