"""kwok v0.8.0 can leave a pod bound to a node it has just taken over Pending for good; this loop shows it the pod again.

The race (sigs.k8s.io/kwok pkg/kwok/controllers): a new node's DaemonSet pods are bound at once. kwok skips a pod
whose node's Lease it does not hold yet ("read only", pod_controller.go watchResources). When it has created the
Lease (node_lease_controller.go sync), it lists the node's pods again (controller.go podsOnNodeSyncWorker), but asks
"held?" of its Lease informer, which may not have the new Lease yet: the pod is skipped a second time, and no later
event brings it back, since nothing else changes a Pending pod. On a loaded machine a new node then never gets its
NFD worker, and a migration waits out its readiness timeout (seen in CI: operator readiness failed after 300 s).

A kubelet has no such gap, so the local cluster must not either: a pod bound to a kwok node and still Pending after
`after` seconds (kwok's pod-running stage needs 0.3 s) gets an annotation touched, an update kwok handles like any
other. A pod kwok deliberately leaves alone (its node's Lease lapsed) stays as it is: kwok skips it again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from kubernetes import client

from .cluster_cache import ClusterCache
from .polling import Polled

KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")  # the nodes kwok plays (control_plane.py)
RESYNC_ANNOTATION = "gpu-migration.local/kwok-resync"


def stuck_pods(pods: Iterable[client.V1Pod], kwok_nodes: set[str], pending_since: dict[str, float], now: float,
               after: float) -> list[client.V1Pod]:
    """The pods to show kwok again: bound to a kwok node, Pending, not being deleted, for `after` seconds since first
    seen so (or since their last touch). `pending_since` (pod UID -> time) is updated: touched pods start again, pods
    no longer Pending are forgotten."""
    waiting = {}
    for pod in pods:
        if pod.spec.node_name in kwok_nodes and pod.status and pod.status.phase == "Pending" and \
                pod.metadata.deletion_timestamp is None:
            waiting[pod.metadata.uid] = pod
    for uid in set(pending_since) - set(waiting):
        del pending_since[uid]
    due = []
    for uid, pod in waiting.items():
        if now - pending_since.setdefault(uid, now) >= after:
            due.append(pod)
            pending_since[uid] = now
    return due


@dataclass
class KwokResync(Polled):
    api_client: client.ApiClient
    cache: ClusterCache
    after: float = 2.0
    interval: float = 1.0
    clock: Callable[[], float] = time.monotonic
    touched: int = 0
    _pending_since: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)

    def start(self) -> "KwokResync":
        self._poll("kwok-resync", self.step)
        return self

    def step(self) -> None:
        key, value = KWOK_NODE_ANNOTATION
        nodes = {n.metadata.name for n in self.cache.nodes() if (n.metadata.annotations or {}).get(key) == value}
        for pod in stuck_pods(self.cache.pods(), nodes, self._pending_since, self.clock(), self.after):
            self.touched += 1
            try:
                self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, {"metadata": {
                    "annotations": {RESYNC_ANNOTATION: str(self.touched)}}})
            except client.ApiException as e:
                if e.status != 404:  # deleted meanwhile: nothing to show
                    raise
