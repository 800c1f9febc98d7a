"""A real node: the kubelet and containerd tools/build made, in a node room of their own (gpu_migration_local/nodes),
joined to a real control plane with the Node authorizer and NodeRestriction. One control plane for the file and a
node for most of it (a second for the program's switch); the tests run in order, each starting where the one before
left its node.

What the kubelet itself decides is checked here, nothing played: it registers Ready; a device plugin on the real
v1beta1 API makes `nvidia.com/gpu` allocatable, a pod gets its GPU through Allocate and CDI; the plugin gone,
allocatable falls to 0 (capacity lingers: the kubelet's grace, pkg/kubelet/cm/devicemanager/manager.go); then the DRA
kubelet plugin on k8s.io/dynamic-resource-allocation/kubeletplugin and a DeviceClass with `extendedResourceName`:
a pod requesting `nvidia.com/gpu: 1` is given a claim by the scheduler, admitted by the kubelet, prepared by the
plugin and run with the CDI device; the program's smoke test judges such a pod. Then the program's switch forward
and back on a second node, a kubelet restart there, and a room killed mid-run. Stopping the room leaves no cgroup,
link or process behind. The GPU Operator's and the DRA chart's placement by labels is played (PathReactor): the
operator's pods on real nodes are issue 38's next step.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from kubernetes import client, config as kconfig

from gpu_migration_local import tools
from gpu_migration_local.control_plane import ControlPlane
from gpu_migration_local.nodes import host
from gpu_migration_local.nodes.room import WORKLOAD_IMAGE, NodesRoom, gpu_uuids

from .kube import eventually

RESOURCE = "nvidia.com/gpu"
NODE = "gpu-real-1"


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    work = tmp_path_factory.mktemp("real-kubelet")
    cp = ControlPlane(work / "cp", tools.bin_dir(), components=("kube-scheduler", "kube-controller-manager"),
                      real_nodes=True)
    nodes = NodesRoom(cp, work / "nodes")
    try:
        cp.start()
        nodes.start()
        yield nodes
    finally:
        nodes.stop()
        cp.stop()
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f"gm{nodes.tag}" not in links, links
        assert not [m for m in host.cgroup_mounts() if list(m.glob(f"gpu-migration-{nodes.tag}-*"))]
        assert not list(nodes.ledgers.glob(f"{os.getpid()}.json"))


@pytest.fixture(scope="module")
def core(room):
    return client.CoreV1Api(kconfig.new_client_from_config(str(room.control_plane.kubeconfig)))


def _gpu_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "cuda", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "resources": {"limits": {RESOURCE: "1"}}}]}}


def _running_log(core, name: str) -> str:
    """The pod's log once it runs and printed, read through the API server from the kubelet (its client cert)."""
    eventually(lambda: core.read_namespaced_pod(name, "default").status.phase == "Running", f"{name} Running", 60)
    return eventually(lambda: core.read_namespaced_pod_log(name, "default"), f"{name}'s log", 30)


def _delete(core, name: str) -> None:
    core.delete_namespaced_pod(name, "default", grace_period_seconds=1)
    eventually(lambda: name not in {p.metadata.name for p in core.list_namespaced_pod("default").items},
               f"{name} gone", 60)


def test_the_node_registers_ready(room, core):
    room.add_node(NODE)
    node = core.read_node(NODE)
    assert node.status.node_info.kubelet_version == "v1.37.2"
    assert node.status.node_info.container_runtime_version == "containerd://2.4.2"
    assert [a.address for a in node.status.addresses if a.type == "InternalIP"] == [room.nodes[NODE].net.ip]
    assert RESOURCE not in (node.status.allocatable or {})


def test_a_device_plugin_makes_gpus_allocatable_and_its_absence_zero(room, core):
    plugin = room.start_device_plugin(NODE, gpus=2)
    eventually(lambda: core.read_node(NODE).status.allocatable.get(RESOURCE) == "2",
               "allocatable nvidia.com/gpu 2 from the device plugin", 60)
    core.create_namespaced_pod("default", _gpu_pod("via-plugin"))
    log = _running_log(core, "via-plugin")
    assert log.strip() in {f"NVIDIA_VISIBLE_DEVICES={u}" for u in gpu_uuids(NODE, 2)}, log
    assert "Allocate [" in plugin.tail()
    _delete(core, "via-plugin")
    room.nodes[NODE].stop_process("device-plugin")
    # The kubelet marks the endpoint's devices unhealthy once the plugin's stream ends; capacity stays until the
    # endpoint's grace period ends (pkg/kubelet/cm/devicemanager/manager.go endpointStopGracePeriod, 5 min).
    node = eventually(lambda: (n := core.read_node(NODE)).status.allocatable.get(RESOURCE) == "0" and n,
                      "allocatable nvidia.com/gpu 0 after the device plugin stopped", 90)
    assert node.status.capacity.get(RESOURCE) == "2"


def test_a_gpu_pod_runs_through_the_dra_kubelet_plugin(room, core):
    custom = client.CustomObjectsApi(core.api_client)
    room.start_dra_plugin(NODE, gpus=2)
    eventually(lambda: [s for s in custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")[
        "items"] if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == "gpu.nvidia.com"],
        "the DRA plugin's ResourceSlice", 60)
    custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"extendedResourceName": RESOURCE, "selectors": [{"cel": {"expression":
                 "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}})
    core.create_namespaced_pod("default", _gpu_pod("via-dra"))
    log = _running_log(core, "via-dra")
    pod = core.read_namespaced_pod("via-dra", "default")
    claim_name = pod.status.extended_resource_claim_status.resource_claim_name
    claim = custom.get_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", claim_name)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    device = int(result["device"].removeprefix("gpu-"))
    # The kubelet called NodePrepareResources; containerd injected the CDI device the plugin named.
    assert log.strip() == f"NVIDIA_VISIBLE_DEVICES={gpu_uuids(NODE, 2)[device]}", log
    plugin = room.nodes[NODE].processes["dra-plugin"]
    assert "NodePrepareResources default/" in plugin.tail(50)
    _delete(core, "via-dra")
    eventually(lambda: "NodeUnprepareResources" in plugin.tail(50), "NodeUnprepareResources", 30)



def test_the_programs_smoke_test_passes_on_a_real_kubelet(room, core):
    """kube/smoke.py's four criteria, judged on a pod the kubelet ran through the DRA path with the stack file's own
    command (Pulumi.local.yaml smokeTest.command): scheduled on the node, allocated through DRA, the container saw
    exactly the allocated GPU (`nvidia-smi -L` from the CDI-injected environment), the command succeeded."""
    from iks_gpu_migration.kube.smoke import _SmokeTestVerificationProvider
    pod = core.create_namespaced_pod("default", {"metadata": {"name": "smoke"}, "spec": {
        "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NODE},
        "containers": [{"name": "cuda", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "nvidia-smi -L && sleep 3"],
                        "resources": {"limits": {RESOURCE: "1"}}}]}})
    outs = _SmokeTestVerificationProvider().create(dict(
        kubeconfig=str(room.control_plane.kubeconfig), namespace="default", pod_name="smoke",
        pod_uid=pod.metadata.uid, node=NODE, driver="gpu.nvidia.com", extended_resource=RESOURCE,
        dra_namespace=None, timeout=60, poll_interval=0.5)).outs
    assert outs["gpu_uuid"] in gpu_uuids(NODE, 2) and outs["result"].startswith("passed"), outs
    assert outs["device"].startswith(f"gpu.nvidia.com/{NODE}/gpu-"), outs
    assert core.read_namespaced_pod("smoke", "default").status.phase == "Succeeded"
    _delete(core, "smoke")

KILLED_ROOM = """
import json, sys, time
from gpu_migration_local.control_plane import ControlPlane
from gpu_migration_local.pki import ClusterCA
from gpu_migration_local.nodes.room import NodesRoom
import pathlib
a = json.loads(sys.argv[1])
cp = ControlPlane(pathlib.Path(a["cp"]), pathlib.Path(a["bin"]), apiserver_port=a["port"], real_nodes=True)
cp.ca = ClusterCA(cp.workdir / "pki")
room = NodesRoom(cp, pathlib.Path(a["work"]), ledgers=pathlib.Path(a["ledgers"])).start()
room.add_node(a["node"])
print(json.dumps({"tag": room.tag, "bridge": room.nodes[a["node"]].net.bridge}), flush=True)
time.sleep(600)
"""


def test_what_a_killed_run_left_is_undone_by_the_next_start(room, core, tmp_path):
    """A room SIGKILLed with a node and a running pod leaves its kubelet, containerd, shim and container, its
    cgroups and bridge; the next room's start undoes all of it from the record the killed one left."""
    cp, ledgers, node = room.control_plane, tmp_path / "ledgers", "gpu-killed"
    args = {"cp": str(cp.workdir), "bin": str(cp.bin_dir), "port": cp.apiserver_port, "work": str(tmp_path / "n"),
            "ledgers": str(ledgers), "node": node}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_ROOM, json.dumps(args)], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline() or "{}")
        assert info, "the room in the subprocess did not start its node"
        core.create_namespaced_pod("default", {"metadata": {"name": "on-killed"}, "spec": {
            "nodeName": node, "containers": [{"name": "c", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never"}]}})
        eventually(lambda: core.read_namespaced_pod("on-killed", "default").status.phase == "Running",
                   "on-killed Running", 60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    cgroup = f"gpu-migration-{info['tag']}-{node}"
    left = host.cgroup_pids(cgroup)
    assert len(left) >= 5, left  # namespace holder, containerd, kubelet, the pod's shim, pause and workload
    assert info["bridge"] in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    NodesRoom(cp, tmp_path / "next", ledgers=ledgers).start().stop()
    assert not host.cgroup_pids(cgroup)
    assert not [m for m in host.cgroup_mounts() if (m / cgroup).exists()]
    assert info["bridge"] not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not list(ledgers.glob("*.json"))
    core.delete_namespaced_pod("on-killed", "default", grace_period_seconds=0)
    core.delete_node(node)


class PathReactor:
    """What the GPU Operator and the DRA driver's chart do with the node's labels, by their DaemonSets' node
    selectors: the device plugin runs while nvidia.com/gpu.deploy.device-plugin is not "false" (gpu-operator
    assets/state-device-plugin), the DRA kubelet plugin while the pilot label is set. The kubelet's answers (node
    allocatable, the ResourceSlices it wipes) are its own. Records (allocatable, published DRA devices) meanwhile."""

    def __init__(self, room, core, node: str, pilot: tuple[str, str]):
        self.room, self.core, self.node, self.pilot = room, core, node, pilot
        self.custom = client.CustomObjectsApi(core.api_client)
        self.seen: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _dra_devices(self) -> int:
        items = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
        return sum(len(s["spec"].get("devices") or []) for s in items
                   if s["spec"].get("nodeName") == self.node and s["spec"]["driver"] == "gpu.nvidia.com")

    def _loop(self) -> None:
        node = self.room.nodes[self.node]
        while not self._stop.is_set():
            try:
                n = self.core.read_node(self.node)
                labels = n.metadata.labels or {}
                want_dp = labels.get("nvidia.com/gpu.deploy.device-plugin") != "false"
                want_dra = labels.get(self.pilot[0]) == self.pilot[1]
                if want_dp != ("device-plugin" in node.processes):
                    self.room.start_device_plugin(self.node) if want_dp else node.stop_process("device-plugin")
                if want_dra != ("dra-plugin" in node.processes):
                    self.room.start_dra_plugin(self.node) if want_dra else node.stop_process("dra-plugin")
                self.seen.append((int((n.status.allocatable or {}).get(RESOURCE, "0")), self._dra_devices()))
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
            self._stop.wait(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def test_the_programs_switch_forward_and_back_on_a_real_kubelet(room, core):
    """iks_gpu_migration.kube.switch, as `pulumi up` runs it, on a real node: forward waits until the kubelet reports
    allocatable 0 after the device plugin went, then sets the pilot label; back, it waits until the kubelet wiped
    the DRA plugin's ResourceSlices. The kubelet's own reports never show a GPU on both paths."""
    from iks_gpu_migration.kube.switch import _NodePathSwitchProvider
    node, pilot = "gpu-real-2", ("migration.example.com/gpu-dra", "pilot")
    room.add_node(node)
    core.patch_node(node, {"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": "true"}}})
    props = dict(kubeconfig=str(room.control_plane.kubeconfig), node=node, pilot_label="=".join(pilot),
                 device_plugin_resource=RESOURCE, extended_resource=RESOURCE, driver="gpu.nvidia.com",
                 drain_timeout=30, switch_timeout=120, poll_interval=0.5)
    with PathReactor(room, core, node, pilot) as reactor:
        eventually(lambda: reactor.seen and reactor.seen[-1] == (2, 0), "the device plugin's 2 GPUs", 60)
        t0 = time.monotonic()
        outs = _NodePathSwitchProvider().create({**props, "target": "dra"}).outs
        print(f"forward switch on a real kubelet: {time.monotonic() - t0:.1f} s")
        assert outs["switched"] is True
        eventually(lambda: reactor.seen[-1] == (0, 2), "the DRA plugin's 2 devices, allocatable 0", 60)
        t0 = time.monotonic()
        outs = _NodePathSwitchProvider().create({**props, "target": "device-plugin"}).outs
        print(f"rollback switch on a real kubelet: {time.monotonic() - t0:.1f} s")
        assert outs["rolling_back"] is True
        eventually(lambda: reactor.seen[-1] == (2, 0), "the device plugin's 2 GPUs again", 90)
    assert not reactor.errors, reactor.errors
    assert (0, 2) in reactor.seen and not [s for s in reactor.seen if s[0] > 0 and s[1] > 0], reactor.seen


def test_after_a_kubelet_restart_the_device_plugin_registers_again(room, core):
    """The kubelet forgets its device plugins when it restarts and empties their directory (the trial: 0/0 at once
    without a plugin): the device plugin registers again when it sees a new kubelet.sock, as NVIDIA's does
    (cmd/nvidia-device-plugin/main.go), and the node offers its GPUs again; pods and containerd run on."""
    node = room.nodes["gpu-real-2"]
    assert "device-plugin" in node.processes and "dra-plugin" not in node.processes
    plugin_log = node.processes["device-plugin"].log
    registrations = plugin_log.read_text().count("registered nvidia.com/gpu")
    kubelet = node.restart_kubelet()
    room.wait_ready("gpu-real-2", 60, kubelet)
    eventually(lambda: plugin_log.read_text().count("registered nvidia.com/gpu") > registrations,
               "the device plugin registered again", 60)
    eventually(lambda: core.read_node("gpu-real-2").status.allocatable.get(RESOURCE) == "2",
               "allocatable nvidia.com/gpu 2 after the restart", 60)
