"""The local doubles' view of Nodes and Pods: listed once, then kept current by a watch, as client-go's informers do
(k8s.io/client-go/tools/cache reflector.go ListAndWatch: list, watch from the list's resourceVersion, list again on
410 Gone).

The doubles play kubelets, NFD and a container runtime: each reacts to what changed. Listing every Pod of the cluster
in each double several times a second instead (as they did) took most of a core on a 2-core machine with a
50-node fleet, from the control plane and the program being measured, and made a new node's bring-up wait for the
next pass. A double reads the copy here and wakes on each change (`subscribe`); its own interval stays as the clock
of what is timed (a pod's `sleep`, the kubelet's slice wipe delay, kwok's resync).

The copy can be a moment behind the API server: a double that creates something (IksNodeSync's Nodes) treats
409 AlreadyExists and 404 NotFound as done.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from kubernetes import client, watch

log = logging.getLogger("gpu-migration-local")

WATCH_SECONDS = 5  # each watch request ends after this, so stop() is noticed; the next resumes where it ended
SYNC_TIMEOUT = 60.0


class ClusterCache:
    def __init__(self, api_client: client.ApiClient) -> None:
        core = client.CoreV1Api(api_client)
        self._listers: dict[str, Callable] = {"nodes": core.list_node, "pods": core.list_pod_for_all_namespaces}
        self._objects: dict[str, dict[str, object]] = {kind: {} for kind in self._listers}  # kind -> uid -> object
        self._synced = {kind: threading.Event() for kind in self._listers}
        self._lock = threading.Lock()
        self._subscribers: list[threading.Event] = []
        self._stop = threading.Event()
        self.errors: list[str] = []

    def start(self) -> "ClusterCache":
        for kind in self._listers:
            threading.Thread(target=self._run, args=(kind,), name=f"cache-{kind}", daemon=True).start()
        for kind, synced in self._synced.items():
            if not synced.wait(SYNC_TIMEOUT):
                self.stop()
                raise TimeoutError(f"the local doubles' cache did not list {kind} within {SYNC_TIMEOUT:.0f}s: "
                                   f"{self.errors[-1] if self.errors else 'no answer from the API server'}")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._changed()  # subscribers wake and see their own stop

    def subscribe(self) -> threading.Event:
        """An Event set on every change (and on stop); the subscriber clears it before it reads."""
        event = threading.Event()
        with self._lock:
            self._subscribers.append(event)
        return event

    def nodes(self) -> list[client.V1Node]:
        with self._lock:
            return list(self._objects["nodes"].values())

    def pods(self) -> list[client.V1Pod]:
        with self._lock:
            return list(self._objects["pods"].values())

    def _changed(self) -> None:
        with self._lock:
            for event in self._subscribers:
                event.set()

    def _list(self, kind: str) -> str:
        listed = self._listers[kind]()
        with self._lock:
            self._objects[kind] = {o.metadata.uid: o for o in listed.items}
        self._synced[kind].set()
        self._changed()
        return listed.metadata.resource_version

    def _run(self, kind: str) -> None:
        version = None
        while not self._stop.is_set():
            try:
                version = version or self._list(kind)
                for event in watch.Watch().stream(self._listers[kind], resource_version=version,
                                                  timeout_seconds=WATCH_SECONDS, allow_watch_bookmarks=True):
                    obj = event["object"]
                    if event["type"] == "BOOKMARK":  # only a resourceVersion, left as JSON by the client
                        version = obj["metadata"]["resourceVersion"]
                    else:
                        version = obj.metadata.resource_version
                        with self._lock:
                            if event["type"] == "DELETED":
                                self._objects[kind].pop(obj.metadata.uid, None)
                            else:
                                self._objects[kind][obj.metadata.uid] = obj
                        self._changed()
                    if self._stop.is_set():
                        return
            except client.ApiException as e:
                if e.status == 410:  # too old to resume from: list again (the reflector's relist)
                    version = None
                    continue
                self._failed(kind, f"{e.status} {e.reason}")
            except Exception as e:  # noqa: BLE001 - the API server restarting or stopping: retry until stopped
                self._failed(kind, f"{type(e).__name__}: {e}")

    def _failed(self, kind: str, error: str) -> None:
        if self._stop.is_set():
            return
        message = f"watching {kind}: {error}"
        if not self.errors or self.errors[-1] != message:
            log.warning("local doubles' cache: %s", message)
            self.errors.append(message)
        self._stop.wait(0.5)
