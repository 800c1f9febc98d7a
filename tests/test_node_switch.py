"""Switching a node between the device plugin and DRA (iks_gpu_migration.kube.switch) against the real API server
(tests/envtest.py) with GpuNode (tests/gpu_node.py) playing the device plugin, the DRA kubelet plugin and the
kubelet: no GPU is ever offered on both paths."""
import pytest
from kubernetes import client


from iks_gpu_migration.kube.provider import CheckFailed
from tests.envtest import eventually
from tests.gpu_node import DEVICE_PLUGIN_LABEL, GpuNode
from iks_gpu_migration.kube.cordon import CORDON_ANNOTATION, uncordon_if_ours
from iks_gpu_migration.kube.switch import _NodePathSwitchProvider
from iks_gpu_migration.kube import cluster

PILOT = ("migration.example.com/gpu-dra", "pilot")
GPU, DRIVER = "nvidia.com/gpu", "gpu.nvidia.com"
UUID0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"


@pytest.fixture
def n1(kube):
    return kube.name("n1")


@pytest.fixture
def node(kube, n1):
    """n1 on the device-plugin path, its GPU played by GpuNode, which records the node's state at every change."""
    kube.add_node(n1, labels={DEVICE_PLUGIN_LABEL: "true"})
    model = GpuNode(kube, n1, {"gpu-0": UUID0}, PILOT).start()
    eventually(lambda: kube.allocatable(n1).get(GPU) == "1", "the device plugin to offer the GPU")
    yield model
    model.stop()
    assert not model.errors, model.errors


def _state(kube) -> tuple:
    n = kube.node(kube.name("n1"))
    labels = n["metadata"].get("labels") or {}
    return (bool(n["spec"].get("unschedulable")), labels.get(DEVICE_PLUGIN_LABEL), labels.get(PILOT[0]),
            n["status"]["allocatable"].get(GPU), bool(kube.slices(kube.name("n1"))))


def settled(kube, expected: tuple) -> None:
    """The node reaches `expected` (GpuNode reacts to a change asynchronously, as the real components do)."""
    eventually(lambda: _state(kube) == expected, f"node state {expected}")


def first(states, predicate) -> int:
    return next(i for i, s in enumerate(states) if predicate(s))


def switch(kubeconfig, node, target, drain=2.0, switch_timeout=2.0, **steps):
    """The switch alone, or with its later steps (`steps`: check_* for the rollback check, operator_namespace etc.)."""
    props = dict(kubeconfig=kubeconfig, node=node, target=target, pilot_label="=".join(PILOT),
                 device_plugin_resource=GPU, extended_resource=GPU, driver=DRIVER, drain_timeout=drain,
                 switch_timeout=switch_timeout, poll_interval=0.02, **steps)
    return _NodePathSwitchProvider().create(props).outs


def training_pod(kube, path="device-plugin"):
    status = {} if path == "device-plugin" else {
        "extendedResourceClaimStatus": {"resourceClaimName": "training-claim", "requestMappings": [
            {"containerName": "main", "resourceName": GPU, "requestName": "container-0-request-0"}]}}
    return kube.add_pod(kube.ns("ml"), "training", node=kube.name("n1"), requests={GPU: "1"}, **status)


def patch_labels(kubeconfig, node, labels):
    from kubernetes import config
    with config.new_client_from_config(config_file=kubeconfig) as api:
        client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": labels}})


# --- the failures the old single label patch caused --------------------------------------------------------------


def test_one_label_patch_forward_hands_a_held_gpu_to_dra(kube, kubeconfig, node, n1):
    training_pod(kube)
    patch_labels(kubeconfig, n1, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})  # what the program did before
    eventually(lambda: node.violations, "a violation")
    assert f"{kube.ns('ml')}/training holds a GPU through the device plugin while DRA publishes it" in \
        node.violations[0]


def test_one_label_patch_rollback_offers_both_paths_until_the_kubelet_wipes_slices(kube, kubeconfig, node, n1):
    patch_labels(kubeconfig, n1, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})
    settled(kube, (False, "false", PILOT[1], "0", True))
    assert not node.violations
    patch_labels(kubeconfig, n1, {PILOT[0]: None, DEVICE_PLUGIN_LABEL: None})  # SSA dropping both labels at once
    eventually(lambda: node.violations, "a violation")
    assert "nvidia.com/gpu allocatable and DRA devices published" in node.violations[0]


# --- the step-by-step switch ---------------------------------------------------------------------------------------


def test_forward_and_rollback_never_offer_a_gpu_twice_with_a_long_running_device_plugin_pod(kube, kubeconfig, node,
                                                                                          n1, monkeypatch):
    ml = kube.ns("ml")
    training_pod(kube)
    # The first forward switch times out while the pod runs: node left cordoned, device plugin still on, no DRA.
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, n1, "dra", drain=0.3)
    assert f"device-plugin GPU pods on node {n1} to finish or move" in str(e.value) and f"{ml}/training" in str(e.value)
    assert f"node {n1} is left cordoned, its device plugin still on and no pilot label" in str(e.value)
    assert _state(kube) == (True, "true", None, "1", False)

    # The next `up` resumes; the pod finishes while it waits.
    with monkeypatch.context() as m:
        kube.after_calls(m, cluster, "device_plugin_gpu_pods", 3,
                         lambda: kube.update_pod_status(ml, "training", phase="Succeeded"))
        assert switch(kubeconfig, n1, "dra")["switched"] is True
    settled(kube, (True, "false", PILOT[1], "0", True))
    s = list(node.states)
    plugin_off = first(s, lambda x: x[1] == "false")
    pilot = first(s, lambda x: x[2] == PILOT[1])
    # The device plugin's GPUs were gone (allocatable 0) before the pilot label came, and stayed gone.
    assert plugin_off < pilot and s[pilot - 1][3] == "0" and s[pilot - 1][1] == "false"
    assert all(x[3] == "0" for x in s[pilot:])
    assert all(x[0] for x in s[plugin_off:])  # cordoned throughout
    assert kube.annotations(n1)[CORDON_ANNOTATION] == "dra"
    assert switch(kubeconfig, n1, "dra")["switched"] is False  # already there: nothing happens

    # A DRA pod runs; rollback waits for it, removes the pilot label, waits for the slices to be wiped, and only
    # then turns the device plugin back on.
    kube.delete_pod(ml, "training")
    training_pod(kube, path="dra")
    mark = len(node.states)
    with monkeypatch.context() as m:
        kube.after_calls(m, cluster, "gpu_pods", 2,
                         lambda: kube.update_pod_status(ml, "training", phase="Succeeded"))
        assert switch(kubeconfig, n1, "device-plugin")["rolling_back"] is True
    settled(kube, (True, "true", None, "1", False))
    s = node.states[mark:]
    unlabelled = first(s, lambda x: x[2] is None)
    wiped = first(s, lambda x: not x[4])
    plugin_on = first(s, lambda x: x[1] == "true")
    assert unlabelled < wiped <= plugin_on and s[plugin_on - 1][4] is False
    assert node.violations == []


def test_rollback_times_out_when_slices_stay(kube, kubeconfig, node, n1):
    node.wipe_delay = None  # the kubelet never wipes them
    patch_labels(kubeconfig, n1, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})
    settled(kube, (False, "false", PILOT[1], "0", True))
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, n1, "device-plugin", switch_timeout=0.3)
    assert f"ResourceSlices of driver gpu.nvidia.com on node {n1} to be wiped" in str(e.value)
    assert "1 DRA devices of driver gpu.nvidia.com still published" in str(e.value)
    assert _state(kube)[1:3] == ("false", None)  # the device plugin stays off
    assert node.violations == []


def test_switch_leaves_a_node_cordoned_by_someone_else_alone(kube, kubeconfig, node, n1):
    kube.cordon(n1)
    switch(kubeconfig, n1, "dra")
    assert CORDON_ANNOTATION not in kube.annotations(n1)
    assert kube.labels(n1)[PILOT[0]] == PILOT[1]  # it did switch
    from kubernetes import config
    with config.new_client_from_config(config_file=kubeconfig) as api:
        assert uncordon_if_ours(api, n1) is False
    assert kube.unschedulable(n1) is True


def run_check_pods(kube, namespace, node):
    """Plays the scheduler and kubelet for check pods: bound to `node`, print the GPU, end."""
    def run(pod):
        name = pod["metadata"]["name"]
        kube.bind(namespace, name, node)
        kube.set_log(namespace, name, f"GPU 0: NVIDIA L4 (UUID: {UUID0})\n", container=pod["spec"]["containers"][0]["name"])
        kube.set_pod_status(namespace, name, {"phase": "Succeeded", "containerStatuses": [
            kube.container_status(ready=False, exit_code=0)]})
    kube.on_pod_create(namespace, run)


def test_switch_with_its_rollback_check_rolls_back_checks_and_uncordons(kube, kubeconfig, node, n1):
    patch_labels(kubeconfig, n1, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})
    settled(kube, (False, "false", PILOT[1], "0", True))
    pilot_ns = kube.name("gpu-pilot")  # the check creates it
    run_check_pods(kube, pilot_ns, n1)
    check = dict(check_image="cuda", check_namespace=pilot_ns, check_timeout=2,
                 check_tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])
    outs = switch(kubeconfig, n1, "device-plugin", **check)
    assert (outs["rolling_back"], outs["gpu_uuid"]) == (True, UUID0)
    assert _state(kube) == (False, "true", None, "1", False) and CORDON_ANNOTATION not in kube.annotations(n1)
    assert node.violations == []
    # The namespace the check made enforces Pod Security restricted, and the API server admitted the check pod there.
    labels = kube.core.read_namespace(pilot_ns).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # Once there, the switch and its check have nothing to do.
    outs = switch(kubeconfig, n1, "device-plugin", **check)
    assert (outs["rolling_back"], outs["result"]) == (False, "not rolling back")


def test_a_rollback_cut_short_before_its_check_resumes_with_the_check(kube, kubeconfig, node, n1):
    """The labels are back on the device plugin but the check never ran (the run was killed): the node is still
    cordoned for the rollback. The next run does not take the node as never switched (which would only uncordon
    it): it runs the check, which uncordons."""
    patch_labels(kubeconfig, n1, {PILOT[0]: PILOT[1], DEVICE_PLUGIN_LABEL: "false"})
    settled(kube, (False, "false", PILOT[1], "0", True))
    assert switch(kubeconfig, n1, "device-plugin")["rolling_back"] is True  # the labels, no check
    settled(kube, (True, "true", None, "1", False))
    assert kube.annotations(n1)[CORDON_ANNOTATION] == "device-plugin"
    pilot_ns = kube.name("gpu-pilot")
    run_check_pods(kube, pilot_ns, n1)
    outs = switch(kubeconfig, n1, "device-plugin", check_image="cuda", check_namespace=pilot_ns, check_timeout=2)
    assert (outs["rolling_back"], outs["gpu_uuid"]) == (True, UUID0)
    assert _state(kube) == (False, "true", None, "1", False) and CORDON_ANNOTATION not in kube.annotations(n1)


def test_switch_ends_with_the_nodes_readiness(kube, kubeconfig, node, n1):
    """After the switch, the node's readiness (kube/readiness.py): here no GPU Operator pod runs on it."""
    operator_ns = kube.ns("gpu-operator")
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, n1, "device-plugin", operator_namespace=operator_ns, ready_timeout=0.2)
    assert f"GPU Operator on node {n1} (device-plugin) did not pass" in str(e.value)
    assert f"node {n1}: no GPU Operator pods in namespace {operator_ns}" in str(e.value)


def test_switch_never_touches_a_pilot_label_paused_for_a_driver_upgrade(kube, kubeconfig, node, n1):
    # The driver manager rewrote the label (NODE_LABEL_FOR_GPU_POD_EVICTION = the pilot label key).
    # NVIDIA/k8s-driver-manager maybeSetPaused: "pilot" -> "pilot_paused-for-driver-upgrade", "true" -> "paused-...".
    for paused in (f"{PILOT[1]}_paused-for-driver-upgrade", "paused-for-driver-upgrade"):
        patch_labels(kubeconfig, n1, {PILOT[0]: paused, DEVICE_PLUGIN_LABEL: "false"})
        before = (False, "false", paused, "0", False)
        settled(kube, before)
        version = kube.node(n1)["metadata"]["resourceVersion"]
        for target in ("dra", "device-plugin"):
            with pytest.raises(CheckFailed, match="driver manager is upgrading the driver there"):
                switch(kubeconfig, n1, target)
        assert _state(kube) == before and node.violations == []
        assert kube.node(n1)["metadata"]["resourceVersion"] == version  # not written at all


def test_calling_off_an_unfinished_forward_switch_uncordons(kube, kubeconfig, node, n1):
    training_pod(kube)
    with pytest.raises(CheckFailed):
        switch(kubeconfig, n1, "dra", drain=0.3)
    assert _state(kube) == (True, "true", None, "1", False)
    assert switch(kubeconfig, n1, "device-plugin")["rolling_back"] is False  # stage set back: nothing to roll back
    assert _state(kube) == (False, "true", None, "1", False)
    assert CORDON_ANNOTATION not in kube.annotations(n1)


def test_pilot_label_waits_for_a_pod_that_started_during_the_switch(kube, kubeconfig, node, n1, monkeypatch):
    # A pod tolerating the cordon got a plugin GPU just before the plugin went away: no pilot label until it ends.
    ml = kube.ns("ml")
    real = cluster.device_plugin_gpu_pods
    calls = []

    def spy(*args):
        result = real(*args)
        calls.append(args)
        if len(calls) == 1:  # right after the first wait saw no such pod
            training_pod(kube)
        if len(calls) == 5:
            kube.update_pod_status(ml, "training", phase="Succeeded")
        return result

    monkeypatch.setattr(cluster, "device_plugin_gpu_pods", spy)
    assert switch(kubeconfig, n1, "dra")["switched"] is True
    assert kube.pod(ml, "training")["status"]["phase"] == "Succeeded"
    settled(kube, (True, "false", PILOT[1], "0", True))
    assert node.violations == []


def test_api_error_during_a_switch_wait_says_the_node_is_left_cordoned(kube, kubeconfig, node, n1, monkeypatch):
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
        switch(kubeconfig, n1, "dra")
    message = str(e.value)
    assert (f"reading the cluster failed while waiting for device-plugin GPU pods on node {n1} to finish or move: "
            "HTTP 500") in message
    assert f"node {n1} is left cordoned, its device plugin still on and no pilot label; run `pulumi up` again" in message
    assert _state(kube) == (True, "true", None, "1", False)
