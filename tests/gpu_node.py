"""What one GPU node's NVIDIA components and kubelet do in answer to its labels, played against the real API server
(tests/envtest.py) for the path-switch tests (tests/test_node_switch.py):

- GPU Operator device plugin: its DaemonSet selects `nvidia.com/gpu.deploy.device-plugin: "true"`; any value but
  "false" is treated as on here (NVIDIA/gpu-operator assets/state-device-plugin/0500_daemonset.yaml; an existing
  value is honoured, controllers/state_manager.go). While it runs, the kubelet reports the GPUs as allocatable.
- Kubelet: when the plugin's endpoint stops, allocatable drops to 0 and capacity stays 0, not absent (kubernetes
  pkg/kubelet/cm/devicemanager, pkg/kubelet/nodestatus/setters.go). Written through the node's status subresource.
- DRA kubelet plugin (pinned by the chart's kubeletPlugin.nodeSelector to the pilot label): publishes one
  resource.k8s.io/v1 ResourceSlice with the node's GPUs. When the label goes, the kubelet wipes the slices some time
  later (~30 s after unregistration, pkg/kubelet/cm/dra): here after `wipe_delay` seconds (None: never).

It watches the Node and reacts to every change in order, in one thread. It is the only writer of the node's
allocatable and slices, so it checks for a GPU offered on both paths where one could arise, against the server:
device-plugin allocatable > 0 while it publishes DRA devices, or publishing while a pod holds a GPU through the
device plugin (the scheduler uses DRA on a node whose allocatable is 0, so that GPU would go to a second pod:
KEP-5004). `states` records (cordoned, device-plugin label, pilot label, allocatable, slices published) at every
Node change it saw and at every wipe, in order.
"""
from __future__ import annotations

import threading
from typing import Optional

from kubernetes import client, watch

DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
TERMINAL = ("Succeeded", "Failed")


class GpuNode:
    def __init__(self, kube, node: str, gpus: dict[str, str], pilot: tuple[str, str],
                 resource: str = "nvidia.com/gpu", driver: str = "gpu.nvidia.com",
                 wipe_delay: Optional[float] = 0.2) -> None:
        self.kube, self.node, self.gpus, self.pilot = kube, node, gpus, pilot
        self.resource, self.driver, self.wipe_delay = resource, driver, wipe_delay
        self.violations: list[str] = []
        self.states: list[tuple] = []
        self.errors: list[str] = []
        self.published = False
        self.allocatable: Optional[str] = None  # as this double last wrote it
        self._lock = threading.RLock()
        self._last: Optional[client.V1Node] = None
        self._wipe: Optional[threading.Timer] = None
        self._stop = threading.Event()
        self._core = client.CoreV1Api(kube.api)
        self._watch: Optional[watch.Watch] = None
        self._thread = threading.Thread(target=self._run, name=f"gpu-node-{node}", daemon=True)

    def start(self) -> "GpuNode":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch:
            self._watch.stop()  # closes the open watch response: the thread ends at once
        if self._wipe:
            self._wipe.cancel()
        self._thread.join(timeout=10)

    # --- the node's components -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                self._watch = w = watch.Watch()
                if self._stop.is_set():
                    return
                kwargs = {"resource_version": version} if version else {}
                for event in w.stream(self._core.list_node, field_selector=f"metadata.name={self.node}",
                                      timeout_seconds=1, **kwargs):
                    node = event["object"]
                    version = node.metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._react(node)
                    if self._stop.is_set():
                        w.stop()
            except Exception as e:  # noqa: BLE001 - the test reads `errors`
                if not self._stop.is_set():
                    self.errors.append(repr(e))
                    return

    def _state(self, node: client.V1Node) -> tuple:
        labels = node.metadata.labels or {}
        allocatable = (node.status.allocatable or {}) if node.status else {}
        return (bool(node.spec.unschedulable), labels.get(DEVICE_PLUGIN_LABEL), labels.get(self.pilot[0]),
                allocatable.get(self.resource), self.published)

    def _react(self, node: client.V1Node) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._last = node
            self.states.append(self._state(node))
            labels = node.metadata.labels or {}
            want = str(len(self.gpus)) if labels.get(DEVICE_PLUGIN_LABEL) != "false" else "0"
            current = ((node.status.allocatable or {}) if node.status else {}).get(self.resource)
            if current != want:
                if want != "0" and self.published:
                    self.violations.append(f"after {self._state(node)}: {self.resource} allocatable and DRA devices "
                                           "published")
                self.kube.set_allocatable(self.node, {self.resource: want})
            self.allocatable = want
            if labels.get(self.pilot[0]) == self.pilot[1]:
                if self._wipe:
                    self._wipe.cancel()
                    self._wipe = None
                if not self.published:
                    self._publish(node)
            elif self.published and self._wipe is None and self.wipe_delay is not None:
                self._wipe = threading.Timer(self.wipe_delay, self._wipe_slices)
                self._wipe.daemon = True
                self._wipe.start()

    def _publish(self, node: client.V1Node) -> None:
        if self.allocatable != "0":
            self.violations.append(f"after {self._state(node)}: {self.resource} allocatable and DRA devices "
                                   "published")
        for pod in self.plugin_pods_holding():
            self.violations.append(f"after {self._state(node)}: {pod} holds a GPU through the device plugin while "
                                   "DRA publishes it")
        self.kube.add_slice(self.node, self.driver, self.gpus)
        self.published = True

    def _wipe_slices(self) -> None:
        with self._lock:
            if self._wipe is None or self._stop.is_set():
                return
            self._wipe = None
            self.kube.delete_slices(self.node)
            self.published = False
            if self._last is not None:
                self.states.append(self._state(self._last)[:4] + (False,))

    def plugin_pods_holding(self) -> list[str]:
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
        return sorted(
            f"{p.metadata.namespace}/{p.metadata.name}" for p in pods
            if (p.status.phase if p.status else None) not in TERMINAL and p.metadata.deletion_timestamp is None
            and not (p.status and p.status.extended_resource_claim_status)
            and any(self.resource in ((c.resources and c.resources.limits) or {}) for c in p.spec.containers))
