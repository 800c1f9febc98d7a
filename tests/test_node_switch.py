"""Switching a node between the device plugin and DRA (iks_gpu_migration.node_switch) against the Kubernetes API
emulator with GpuNodeModel playing the device plugin, the DRA kubelet plugin and the kubelet: no GPU is ever offered
on both paths."""
import pytest
from kubernetes import client


from iks_gpu_migration.kube.provider import CheckFailed
from tests.emulators.kube import DEVICE_PLUGIN_LABEL, GpuNodeModel
from iks_gpu_migration.kube.cordon import CORDON_ANNOTATION, uncordon_if_ours
from iks_gpu_migration.kube.rollback import _RollbackVerificationProvider
from iks_gpu_migration.kube.switch import _NodePathSwitchProvider
from iks_gpu_migration.kube import cluster

PILOT = ("migration.example.com/gpu-dra", "pilot")
GPU, DRIVER = "nvidia.com/gpu", "gpu.nvidia.com"
UUID0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"


@pytest.fixture
def node(kube):
    """n1 on the device-plugin path, its GPU modelled; every request's resulting node state is recorded."""
    kube.add_node("n1", labels={DEVICE_PLUGIN_LABEL: "true"})
    model = GpuNodeModel(kube, "n1", {"gpu-0": UUID0}, PILOT)
    model.states = []
    kube.controllers.append(lambda m, p: model.states.append(_state(kube)))
    return model


def _state(kube) -> tuple:
    n = kube.nodes["n1"]
    labels = n["metadata"].get("labels") or {}
    return (bool(n["spec"].get("unschedulable")), labels.get(DEVICE_PLUGIN_LABEL), labels.get(PILOT[0]),
            n["status"]["allocatable"].get(GPU), bool([s for s in kube.slices if s["spec"]["nodeName"] == "n1"]))


def first(states, predicate) -> int:
    return next(i for i, s in enumerate(states) if predicate(s))


def switch(kubeconfig, target, drain=2.0, switch_timeout=2.0):
    props = dict(kubeconfig=kubeconfig, node="n1", target=target, pilot_label="=".join(PILOT),
                 device_plugin_resource=GPU, extended_resource=GPU, driver=DRIVER, drain_timeout=drain,
                 switch_timeout=switch_timeout, poll_interval=0.02)
    return _NodePathSwitchProvider().create(props).outs


def training_pod(kube, path="device-plugin"):
    status = {} if path == "device-plugin" else {
        "extendedResourceClaimStatus": {"resourceClaimName": "training-claim", "requestMappings": []}}
    return kube.add_pod("ml", "training", node="n1", requests={GPU: "1"}, **status)


def patch_labels(kubeconfig, labels):
    from kubernetes import config
    with config.new_client_from_config(config_file=kubeconfig) as api:
        client.CoreV1Api(api).patch_node("n1", {"metadata": {"labels": labels}})


# --- the failures the old single label patch caused --------------------------------------------------------------


def test_one_label_patch_forward_hands_a_held_gpu_to_dra(kube, kubeconfig, node):
    training_pod(kube)
    patch_labels(kubeconfig, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})  # what the program did before
    assert node.violations and "ml/training holds a GPU through the device plugin while DRA publishes it" in \
        node.violations[0]


def test_one_label_patch_rollback_offers_both_paths_until_the_kubelet_wipes_slices(kube, kubeconfig, node):
    patch_labels(kubeconfig, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})
    assert not node.violations
    patch_labels(kubeconfig, {PILOT[0]: None, DEVICE_PLUGIN_LABEL: None})  # SSA dropping both labels at once
    assert node.violations and "nvidia.com/gpu allocatable and DRA devices published" in node.violations[0]


# --- the step-by-step switch ---------------------------------------------------------------------------------------


def test_forward_and_rollback_never_offer_a_gpu_twice_with_a_long_running_device_plugin_pod(kube, kubeconfig, node):
    pod = training_pod(kube)
    # The first forward switch times out while the pod runs: node left cordoned, device plugin still on, no DRA.
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, "dra", drain=0.3)
    assert "device-plugin GPU pods on node n1 to finish or move" in str(e.value) and "ml/training" in str(e.value)
    assert "node n1 is left cordoned, its device plugin still on and no pilot label" in str(e.value)
    assert _state(kube) == (True, "true", None, "1", False)

    # The next `up` resumes; the pod finishes while it waits.
    kube.after(3, "/api/v1/pods", lambda: pod["status"].update(phase="Succeeded"))
    assert switch(kubeconfig, "dra")["switched"] is True
    s = node.states
    plugin_off = first(s, lambda x: x[1] == "false")
    pilot = first(s, lambda x: x[2] == PILOT[1])
    assert s[plugin_off][3] == "0" and plugin_off < pilot and s[pilot - 1][3] == "0"
    assert all(x[0] for x in s[plugin_off:])  # cordoned throughout
    assert _state(kube) == (True, "false", PILOT[1], "0", True)
    assert kube.nodes["n1"]["metadata"]["annotations"][CORDON_ANNOTATION] == "dra"
    assert switch(kubeconfig, "dra")["switched"] is False  # already there: nothing happens

    # A DRA pod runs; rollback waits for it, removes the pilot label, waits for the slices to be wiped, and only
    # then turns the device plugin back on.
    del kube.pods[("ml", "training")]
    dra_pod = training_pod(kube, path="dra")
    kube.after(2, "/api/v1/pods", lambda: dra_pod["status"].update(phase="Succeeded"))
    mark = len(node.states)
    assert switch(kubeconfig, "device-plugin")["rolling_back"] is True
    s = node.states[mark:]
    unlabelled = first(s, lambda x: x[2] is None)
    wiped = first(s, lambda x: not x[4])
    plugin_on = first(s, lambda x: x[1] == "true")
    assert unlabelled < wiped <= plugin_on and s[plugin_on - 1][4] is False
    assert _state(kube) == (True, "true", None, "1", False)
    assert node.violations == []


def test_rollback_times_out_when_slices_stay(kube, kubeconfig, node):
    patch_labels(kubeconfig, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})
    node.wipe_after = 10**6  # the kubelet never wipes them
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, "device-plugin", switch_timeout=0.3)
    assert "ResourceSlices of driver gpu.nvidia.com on node n1 to be wiped" in str(e.value)
    assert "1 DRA devices of driver gpu.nvidia.com still published" in str(e.value)
    assert _state(kube)[1:3] == ("false", None)  # the device plugin stays off
    assert node.violations == []


def test_switch_leaves_a_node_cordoned_by_someone_else_alone(kube, kubeconfig, node):
    kube.nodes["n1"]["spec"]["unschedulable"] = True
    switch(kubeconfig, "dra")
    assert CORDON_ANNOTATION not in (kube.nodes["n1"]["metadata"].get("annotations") or {})
    from kubernetes import config
    with config.new_client_from_config(config_file=kubeconfig) as api:
        assert uncordon_if_ours(api, "n1") is False
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


def test_rollback_verification_uncordons_after_the_check_pod(kube, kubeconfig, node):
    patch_labels(kubeconfig, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})
    assert switch(kubeconfig, "device-plugin")["rolling_back"] is True

    def run(pod):
        pod["spec"]["nodeName"] = "n1"
        pod["status"] = {"phase": "Succeeded"}
        kube.logs[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = f"GPU 0: NVIDIA L4 (UUID: {UUID0})\n"

    kube.on_pod_create = run
    outs = _RollbackVerificationProvider().create(dict(
        kubeconfig=kubeconfig, node="n1", rolling_back=True, extended_resource=GPU, image="cuda", namespace="gpu-pilot",
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}], timeout=2, poll_interval=0.02)).outs
    assert outs["gpu_uuid"] == UUID0
    assert "unschedulable" not in kube.nodes["n1"]["spec"]
    assert CORDON_ANNOTATION not in kube.nodes["n1"]["metadata"].get("annotations", {})
    assert node.violations == []


def test_switch_never_touches_a_pilot_label_paused_for_a_driver_upgrade(kube, kubeconfig, node):
    # The driver manager rewrote the label (NODE_LABEL_FOR_GPU_POD_EVICTION = the pilot label key).
    # NVIDIA/k8s-driver-manager maybeSetPaused: "pilot" -> "pilot_paused-for-driver-upgrade", "true" -> "paused-...".
    for paused in (f"{PILOT[1]}_paused-for-driver-upgrade", "paused-for-driver-upgrade"):
        patch_labels(kubeconfig, {PILOT[0]: paused, DEVICE_PLUGIN_LABEL: "false"})
        before = _state(kube)
        for target in ("dra", "device-plugin"):
            with pytest.raises(CheckFailed, match="driver manager is upgrading the driver there"):
                switch(kubeconfig, target)
        assert _state(kube) == before and node.violations == []


def test_calling_off_an_unfinished_forward_switch_uncordons(kube, kubeconfig, node):
    training_pod(kube)
    with pytest.raises(CheckFailed):
        switch(kubeconfig, "dra", drain=0.3)
    assert _state(kube) == (True, "true", None, "1", False)
    assert switch(kubeconfig, "device-plugin")["rolling_back"] is False  # stage set back: nothing to roll back
    assert _state(kube) == (False, "true", None, "1", False)
    assert CORDON_ANNOTATION not in kube.nodes["n1"]["metadata"]["annotations"]


def test_pilot_label_waits_for_a_pod_that_started_during_the_switch(kube, kubeconfig, node):
    # A pod tolerating the cordon got a plugin GPU just before the plugin went away: no pilot label until it ends.
    def sneak_in():
        late = training_pod(kube)
        kube.after(4, "/api/v1/pods", lambda: late["status"].update(phase="Succeeded"))
    kube.after(1, "/api/v1/pods", sneak_in)  # right after the first wait saw no such pod
    assert switch(kubeconfig, "dra")["switched"] is True
    assert kube.pods[("ml", "training")]["status"]["phase"] == "Succeeded"
    assert node.violations == []


def test_api_error_during_a_switch_wait_says_the_node_is_left_cordoned(kube, kubeconfig, node, monkeypatch):
    """An API failure mid-wait ends the switch like a timeout would: named, with the node's state and how to go on."""
    from kubernetes.client.exceptions import ApiException


    training_pod(kube)
    calls = []
    real = cluster.device_plugin_gpu_pods

    def flaky(*args):
        calls.append(args)
        if len(calls) > 1:
            raise ApiException(status=500, reason="Internal Server Error")
        return real(*args)

    monkeypatch.setattr(cluster, "device_plugin_gpu_pods", flaky)
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, "dra")
    message = str(e.value)
    assert ("reading the cluster failed while waiting for device-plugin GPU pods on node n1 to finish or move: "
            "HTTP 500") in message
    assert "node n1 is left cordoned, its device plugin still on and no pilot label; run `pulumi up` again" in message
    assert _state(kube) == (True, "true", None, "1", False)
