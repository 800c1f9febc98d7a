"""The kube checks and dynamic providers, driving the real kubernetes client against tests/emulators/kube.py."""
import base64
import copy
import json

import dill
import pulumi
import pytest
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException


from iks_gpu_migration.kube.records import VERIFICATION_ANNOTATION
from iks_gpu_migration.kube.provider import CheckFailed
from iks_gpu_migration.common.waiting import Interrupted
from iks_gpu_migration.kube.cordon import CORDON_ANNOTATION
from iks_gpu_migration.kube.fence import _NodeFenceProvider
from iks_gpu_migration.kube.inventory import GpuNodeInventory, _GpuNodeInventoryProvider
from iks_gpu_migration.kube.operands import OperandPlacement, PendingGpuPods, _OperandPlacementProvider, _PendingGpuPodsProvider
from iks_gpu_migration.kube.preflight import DraPreflight, _DraPreflightProvider
from iks_gpu_migration.kube.readiness import OperatorReadiness, _OperatorReadinessProvider, operator_ready
from iks_gpu_migration.kube.records import CONFIG_NAME_ANNOTATION
from iks_gpu_migration.kube.rollback import NodeDrain, ROLLBACK_NODE_LABEL, RollbackVerification, _NodeDrainProvider, _RollbackVerificationProvider
from iks_gpu_migration.kube.smoke import SmokeTestVerification, _SmokeTestVerificationProvider
from iks_gpu_migration.kube.smoke_criteria import verify_smoke
from iks_gpu_migration.kube.switch import NodePathSwitch
from kubernetes import client
from iks_gpu_migration.kube import cluster
from iks_gpu_migration.kube import inventory as kube_inventory
from iks_gpu_migration.kube import preflight as kube_preflight


DRIVER, ER, NS = "gpu.example.com", "example.com/gpu", "gpu-pilot"
PILOT = "migration.example.com/gpu-dra=pilot"
UUID0, UUID1 = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-9f8e7d6c-0000-1111-2222-333344445555"
FAST = {"timeout": 2, "poll_interval": 0.02}
SHORT = {"timeout": 0.3, "poll_interval": 0.02}


@pytest.fixture
def api(kubeconfig):
    with kube_config.new_client_from_config(config_file=kubeconfig) as client:
        yield client


def create(provider, kubeconfig, **props):
    return provider.create({"kubeconfig": kubeconfig, **props}).outs


# --- preflight ---------------------------------------------------------------------------------------------------


@pytest.fixture
def dra_cluster(kube):
    """n1 is dra (slices, no device plugin), n2 is device-plugin."""
    kube.add_node("n1", labels={"migration.example.com/gpu-dra": "pilot"})
    kube.add_node("n2", allocatable={"nvidia.com/gpu": "1"})
    kube.add_slice("n1", DRIVER, {"gpu-0": UUID0})
    return kube


def preflight(api, dra_nodes=("n1",)):
    return kube_preflight.preflight(api, DRIVER, ER, list(dra_nodes), ["n1", "n2"])


def test_preflight_waits_for_slices_then_passes(kube, kubeconfig):
    kube.add_node("n1")
    kube.add_node("n2", allocatable={"nvidia.com/gpu": "1"})
    kube.after(2, "resourceslices", lambda: kube.add_slice("n1", DRIVER, {"gpu-0": UUID0}))
    outs = create(_DraPreflightProvider(), kubeconfig, driver=DRIVER, extended_resource=ER,
                  dra_nodes=["n1"], all_nodes=["n1", "n2"], **FAST)
    assert outs["checked_nodes"] == ["n1"]
    assert sum(1 for _, p in kube.requests if "resourceslices" in p) == 3  # it polled until the slice appeared


def test_preflight_fails_when_the_api_server_drops_extended_resource_name(dra_cluster, api):
    # The OpenAPI schema lists the field, yet the server drops it (feature gate off): only the dry-run tells.
    dra_cluster.stores_extended_resource_name = False
    assert preflight(api) == [
        "API server dropped DeviceClass spec.extendedResourceName on a dry-run create (sent 'example.com/gpu', "
        "read back None): DRA extended resources (feature gate DRAExtendedResource, GA in 1.37) are not enabled"]
    assert dra_cluster.device_classes == {}  # dry run: nothing stored
    assert ("POST", "/apis/resource.k8s.io/v1/deviceclasses?dryRun=All") in dra_cluster.requests


def test_preflight_refuses_a_second_device_class_for_the_extended_resource(dra_cluster, api):
    dra_cluster.add_device_class("example.com-gpu", ER)
    dra_cluster.add_device_class("gpu.nvidia.com", ER)  # e.g. the chart's class (25.12+ maps nvidia.com/gpu)
    dra_cluster.add_device_class("mig.nvidia.com", None)
    problems = kube_preflight.preflight(api, DRIVER, ER, ["n1"], ["n1", "n2"], device_class="example.com-gpu")
    assert problems == ["DeviceClass gpu.nvidia.com also maps extended resource example.com/gpu (the later-created "
                        "class wins); delete it, or let example.com-gpu be the only one"]


def test_preflight_fails_listing_dra_node_without_slices(dra_cluster, kubeconfig):
    with pytest.raises(CheckFailed) as e:
        create(_DraPreflightProvider(), kubeconfig, driver=DRIVER, extended_resource=ER,
               dra_nodes=["n1", "n2"], all_nodes=["n1", "n2"], **SHORT)
    assert "node n2: no ResourceSlice devices of driver gpu.example.com (stage dra)" in str(e.value)
    assert "node n1" not in str(e.value)


def test_preflight_fails_on_slices_of_a_non_dra_node(dra_cluster, api):
    dra_cluster.nodes["n2"]["status"]["allocatable"].pop("nvidia.com/gpu")
    dra_cluster.add_slice("n2", DRIVER, {"gpu-0": UUID1})
    assert preflight(api) == ["node n2: publishes 1 DRA devices of driver gpu.example.com but is not a dra node"]


def test_preflight_fails_on_gpus_offered_by_both_paths(dra_cluster, api):
    dra_cluster.nodes["n1"]["status"]["allocatable"][ER] = "2"
    assert preflight(api) == [
        "node n1: GPUs offered twice: device plugin allocatable {'example.com/gpu': 2} "
        "and 1 DRA devices of driver gpu.example.com"
    ]


def test_preflight_passes_on_a_consistent_cluster(dra_cluster, api):
    assert preflight(api) == []
    assert preflight(api, dra_nodes=()) != []  # n1's slices are then unexpected


# --- smoke-test verification -------------------------------------------------------------------------------------

CLAIM = "gpu-smoke-n1-extended-resources-x7k2p"


@pytest.fixture
def smoke(dra_cluster):
    """A passing smoke test on n1: DRA allocated gpu-0 (UUID0), the pod logged UUID0 and exited 0."""
    dra_cluster.add_claim(NS, CLAIM, [{"driver": DRIVER, "pool": "n1", "device": "gpu-0",
                                       "request": "container-0-request-0"}])
    return dra_cluster.add_pod(
        NS, "gpu-smoke-n1", node="n1", phase="Succeeded", exit_code=0, requests={ER: "1"},
        log=f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {UUID0})\n{UUID0}, NVIDIA A100-SXM4-40GB\n",
        extendedResourceClaimStatus={"resourceClaimName": CLAIM, "requestMappings": [
            {"containerName": "main", "resourceName": ER, "requestName": "container-0-request-0"}]},
    )


def verify(api, dra_namespace=None):
    return verify_smoke(api, NS, "gpu-smoke-n1", "n1", DRIVER, ER, dra_namespace)


@pytest.mark.parametrize("line", [
    # NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/driver.go, v25.8.1 and v25.12.0
    "I1202 12:00:01.000000       1 driver.go:162] Returning newly prepared devices for claim '{uid}': [...]",
    "I1202 12:00:01.000000       1 driver.go:370] Returning newly prepared devices for claim "
    "'gpu-pilot/gpu-smoke-n1-extended-resources-x7k2p:{uid}': [...]",
])
def test_smoke_criterion_2_needs_the_kubelet_plugin_log_line(smoke, kube, api, line):
    claim_uid = kube.claims[(NS, CLAIM)]["metadata"]["uid"]
    assert verify(api, "dra").problems == [
        "criterion 2 (allocation): no DRA kubelet plugin pod on node n1 in namespace dra"]
    kube.add_pod("dra", "nvidia-dra-driver-gpu-kubelet-plugin-abcde", node="n1",
                 log="Returning newly prepared devices for claim 'some-other-uid': []\n")
    assert verify(api, "dra").problems == [
        f"criterion 2 (allocation): DRA kubelet plugin dra/nvidia-dra-driver-gpu-kubelet-plugin-abcde logged no "
        f"prepared devices for claim {NS}/{CLAIM} (uid {claim_uid})"]
    kube.logs[("dra", "nvidia-dra-driver-gpu-kubelet-plugin-abcde")] += line.format(uid=claim_uid) + "\n"
    assert verify(api, "dra").problems == []


def verification(kubeconfig, pod, **timing):
    return create(_SmokeTestVerificationProvider(), kubeconfig, namespace=NS, pod_name="gpu-smoke-n1",
                  pod_uid=pod["metadata"]["uid"], node="n1", driver=DRIVER, extended_resource=ER,
                  **(timing or FAST))


def annotation(kube, node="n1"):
    return json.loads(kube.nodes[node]["metadata"]["annotations"][VERIFICATION_ANNOTATION])


def test_smoke_verification_waits_for_the_pod_and_passes(smoke, kube, kubeconfig):
    finished, smoke["status"] = smoke["status"], {"phase": "Running"}
    kube.after(2, "pods/gpu-smoke-n1", lambda: smoke.update(status=finished))
    outs = verification(kubeconfig, smoke)
    assert (outs["gpu_uuid"], outs["device"], outs["claim"]) == (UUID0, "gpu.example.com/n1/gpu-0", f"{NS}/{CLAIM}")
    assert outs["result"].startswith("passed:")
    assert annotation(kube) | {"checkedAt": None} == {
        "path": "dra", "result": "passed", "pod": f"{NS}/gpu-smoke-n1", "gpu": UUID0,
        "device": "gpu.example.com/n1/gpu-0", "problems": [], "checkedAt": None, "podUid": smoke["metadata"]["uid"]}


def test_smoke_criterion_1_wrong_node(smoke, api):
    smoke["spec"]["nodeName"] = "n2"
    assert verify(api).problems == [
        "criterion 1 (scheduling): pod gpu-pilot/gpu-smoke-n1 is on node 'n2', expected 'n1'"]


def test_smoke_criterion_1_scheduling_error(smoke, kube, api):
    kube.add_event(smoke, "FailedScheduling", "0/2 nodes are available: 1 Insufficient example.com/gpu")
    kube.add_event(smoke, "Scheduled", "Successfully assigned", type_="Normal")
    assert verify(api).problems == ["criterion 1 (scheduling): pod gpu-pilot/gpu-smoke-n1 event FailedScheduling: "
                                    "0/2 nodes are available: 1 Insufficient example.com/gpu"]


def test_smoke_unschedulable_pod_fails_without_waiting_for_timeout(smoke, kube, kubeconfig):
    smoke["spec"].pop("nodeName")
    smoke["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}]}
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, smoke, timeout=30, poll_interval=0.02)
    assert "criterion 1 (scheduling): pod gpu-pilot/gpu-smoke-n1 PodScheduled=False Unschedulable: no GPU" in str(
        e.value)
    assert annotation(kube)["result"] == "failed"


def test_smoke_criterion_2_no_allocation_recorded(smoke, api):
    del smoke["status"]["extendedResourceClaimStatus"]
    assert verify(api).problems == [
        "criterion 2 (allocation): pod gpu-pilot/gpu-smoke-n1 has no status.extendedResourceClaimStatus "
        "(example.com/gpu was not allocated through DRA)"]


def test_smoke_criterion_2_claim_without_device_of_the_driver(smoke, kube, api):
    kube.claims[(NS, CLAIM)]["status"] = {}
    assert verify(api).problems == [
        f"criterion 2 (allocation): ResourceClaim {NS}/{CLAIM} has no device of driver gpu.example.com "
        "for requests ['container-0-request-0']; allocation: no devices"]


def test_smoke_criterion_3_uuid_mismatch(smoke, kube, api):
    kube.logs[(NS, "gpu-smoke-n1")] = f"GPU 0: NVIDIA A100 (UUID: {UUID1})\n"
    assert verify(api).problems == [
        f"criterion 3 (GPU in logs): pod gpu-pilot/gpu-smoke-n1 logs name ['{UUID1}'], "
        f"allocated device gpu.example.com/n1/gpu-0 is {UUID0} (allocated uuid {UUID0} not printed)"]
    kube.logs[(NS, "gpu-smoke-n1")] = f"GPU 0: NVIDIA A100 (UUID: {UUID0})\nGPU 1: NVIDIA A100 (UUID: {UUID1})\n"
    assert verify(api).problems == [
        f"criterion 3 (GPU in logs): pod gpu-pilot/gpu-smoke-n1 logs name ['{UUID0}', '{UUID1}'], "
        f"allocated device gpu.example.com/n1/gpu-0 is {UUID0} (other GPU devices visible: ['{UUID1}'])"]


MIG0 = "MIG-9f8e7d6c-5b4a-3c2d-1e0f-a9b8c7d6e5f4"


def test_smoke_criterion_3_accepts_mig_output(smoke, kube, api):
    # A MIG device: nvidia-smi -L prints its parent GPU's line first, then the MIG line with the allocated uuid.
    kube.slices[0]["spec"]["devices"][0]["attributes"]["uuid"] = {"string": MIG0}
    kube.logs[(NS, "gpu-smoke-n1")] = (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUID1})\n"
                                       f"  MIG 1g.10gb     Device  0: (UUID: {MIG0})\n")
    result = verify(api)
    assert result.problems == [] and result.gpu_uuid == MIG0


def test_smoke_criterion_3_no_gpu_in_logs(smoke, kube, api):
    kube.logs[(NS, "gpu-smoke-n1")] = "No devices were found\n"
    assert verify(api).problems == [
        "criterion 3 (GPU in logs): pod gpu-pilot/gpu-smoke-n1 logs name no GPU UUID; logs: 'No devices were found\\n'"]


def test_smoke_criterion_4_pod_failed(smoke, kube, kubeconfig):
    smoke["status"].update(phase="Failed", containerStatuses=[
        {"name": "main", "image": "img", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}])
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, smoke)
    assert str(e.value).startswith(
        "smoke test gpu-pilot/gpu-smoke-n1 on node n1 failed:\n  - criterion 4 (GPU operation): "
        "pod gpu-pilot/gpu-smoke-n1 phase Failed, containers: ['main exit 3 (Error)']\nnode n1 stays cordoned. "
        "Fix the cause and run `pulumi up` again: it replaces the pod")
    assert annotation(kube)["problems"] == [str(e.value).split("  - ")[1].split("\n")[0]]


def test_smoke_image_pull_failure_is_reported_at_once(smoke, kube, kubeconfig):
    smoke["status"] = {"phase": "Pending", "containerStatuses": [
        {"name": "main", "image": "img", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"cuda:nope\""}}}]}
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, smoke, timeout=30, poll_interval=0.02)  # fails long before the timeout
    assert ('criterion 4 (GPU operation): pod gpu-pilot/gpu-smoke-n1 container main ImagePullBackOff: Back-off '
            'pulling image "cuda:nope"') in str(e.value)


def test_failed_smoke_test_is_rerun_with_a_fresh_pod_by_the_next_up(smoke, kube, kubeconfig):
    failed = copy.deepcopy(smoke)
    smoke["status"]["phase"] = "Failed"
    with pytest.raises(CheckFailed):
        verification(kubeconfig, smoke)
    created = []

    def run(pod):  # the re-created pod is scheduled again and passes
        created.append(pod)
        pod["spec"]["nodeName"] = "n1"
        pod["status"] = copy.deepcopy(failed["status"])
        kube.logs[(NS, pod["metadata"]["name"])] = failed_log

    failed_log = kube.logs[(NS, "gpu-smoke-n1")]
    kube.on_pod_create = run
    outs = verification(kubeconfig, smoke)  # same Pod resource (same uid in state): the next `up`
    assert outs["result"].startswith("passed:") and len(created) == 1
    assert kube.pods[(NS, "gpu-smoke-n1")]["metadata"]["uid"] != smoke["metadata"]["uid"]
    assert annotation(kube)["podUid"] == kube.pods[(NS, "gpu-smoke-n1")]["metadata"]["uid"]
    # Passed: a later verification of the same (re-created) pod judges it again instead of replacing it.
    assert verification(kubeconfig, smoke)["result"].startswith("passed:") and len(created) == 1


def test_a_re_created_smoke_pod_that_fails_again_is_replaced_again(smoke, kube, kubeconfig):
    smoke["status"]["phase"] = "Failed"
    kube.on_pod_create = lambda pod: pod.update(spec={**pod["spec"], "nodeName": "n1"},
                                                status={"phase": "Failed"})
    for expected_pods in (0, 1, 2):  # three `up`s, the Pod resource (and its uid in state) unchanged
        with pytest.raises(CheckFailed):
            verification(kubeconfig, smoke)
        assert kube.requests.count(("POST", f"/api/v1/namespaces/{NS}/pods")) == expected_pods


def test_smoke_pass_with_a_failing_uncordon_says_what_to_do(smoke, kube, kubeconfig, monkeypatch):
    kube.nodes["n1"]["spec"]["unschedulable"] = True
    kube.nodes["n1"]["metadata"]["annotations"] = {CORDON_ANNOTATION: "dra"}
    real = client.CoreV1Api.patch_node

    def refuse_uncordon(self, name, body, **kwargs):
        if "spec" in body:
            raise ApiException(status=403, reason="Forbidden")
        return real(self, name, body, **kwargs)

    monkeypatch.setattr(client.CoreV1Api, "patch_node", refuse_uncordon)
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, smoke)
    message = str(e.value)
    assert message.startswith("smoke test passed: gpu-pilot/gpu-smoke-n1 used ")
    assert "but uncordoning node n1 failed: HTTP 403 Forbidden" in message and "kubectl uncordon n1" in message
    assert annotation(kube)["result"] == "passed"


def test_smoke_pass_uncordons_only_a_node_the_switch_cordoned(smoke, kube, kubeconfig):
    kube.nodes["n1"]["spec"]["unschedulable"] = True
    kube.nodes["n1"]["metadata"]["annotations"] = {CORDON_ANNOTATION: "dra"}
    assert verification(kubeconfig, smoke)["result"].endswith("node n1 uncordoned")
    assert "unschedulable" not in kube.nodes["n1"]["spec"]
    kube.nodes["n1"]["spec"]["unschedulable"] = True  # an admin's cordon: left alone
    assert not verification(kubeconfig, smoke)["result"].endswith("uncordoned")
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


def failing_patch_node(monkeypatch):
    """The API server refuses the annotation patch (e.g. RBAC without patch on nodes)."""
    def refuse(self, name, body, **kwargs):
        raise ApiException(status=403, reason="Forbidden")
    monkeypatch.setattr(client.CoreV1Api, "patch_node", refuse)


def test_failing_to_record_does_not_hide_the_smoke_failure(smoke, kube, kubeconfig, monkeypatch):
    smoke["status"]["phase"] = "Failed"
    failing_patch_node(monkeypatch)
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, smoke)
    message = str(e.value)
    assert message.startswith("smoke test gpu-pilot/gpu-smoke-n1 on node n1 failed:\n  - criterion 4")
    assert "the result could not be recorded on node n1" in message and "HTTP 403 Forbidden" in message
    # Without the record the next `up` can't tell this pod failed: the message says how to re-run instead.
    assert "replace the pod yourself: `pulumi up --replace <URN of smoke-n1>`" in message
    assert "it replaces the pod" not in message


def test_smoke_verification_waits_for_the_expected_pod_uid(smoke, kubeconfig):
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, {"metadata": {"uid": "other-uid"}}, **SHORT)
    assert "pod gpu-pilot/gpu-smoke-n1 to finish" in str(e.value) and "expected other-uid" in str(e.value)


def test_smoke_verification_reruns_only_when_the_pod_changes():
    provider = _SmokeTestVerificationProvider()
    olds = {"pod_uid": "a", "node": "n1", "timeout": 600, "result": "passed"}
    assert provider.diff("id", olds, {"pod_uid": "b", "node": "n1", "timeout": 600}).replaces == ["pod_uid"]
    timeout_only = provider.diff("id", olds, {"pod_uid": "a", "node": "n1", "timeout": 60})
    assert (timeout_only.changes, timeout_only.replaces) == (True, [])
    assert not provider.diff("id", olds, {"pod_uid": "a", "node": "n1", "timeout": 600}).changes


# --- operator readiness ------------------------------------------------------------------------------------------


@pytest.fixture
def operator(dra_cluster):
    for node in ("n1", "n2"):
        dra_cluster.add_pod("gpu-operator", f"nvidia-driver-daemonset-{node}", node=node)
        dra_cluster.add_pod("gpu-operator", f"nvidia-container-toolkit-daemonset-{node}", node=node)
        dra_cluster.add_pod("gpu-operator", f"nvidia-cuda-validator-{node}", node=node, phase="Succeeded", exit_code=0)
    return dra_cluster


def test_operator_ready_on_both_paths(operator, api):
    assert operator_ready(api, "n2", "gpu-operator", "device-plugin") == []
    assert operator_ready(api, "n1", "gpu-operator", "dra", DRIVER) == []


def test_operator_not_ready_lists_pods_and_gpus(operator, api):
    operator.add_pod("gpu-operator", "nvidia-device-plugin-daemonset-n2", node="n2", waiting="CrashLoopBackOff")
    operator.nodes["n2"]["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    assert operator_ready(api, "n2", "gpu-operator", "device-plugin") == [
        "node n2: pod gpu-operator/nvidia-device-plugin-daemonset-n2 is Running (main: CrashLoopBackOff)",
        "node n2: nvidia.com/gpu allocatable is 0 (device plugin not serving)"]
    operator.slices.clear()
    assert operator_ready(api, "n1", "gpu-operator", "dra", DRIVER) == [
        "node n1: no DRA devices in ResourceSlices of driver gpu.example.com"]
    assert operator_ready(api, "n3", "gpu-operator", "dra")[0] == (
        "node n3: no nvidia-driver-daemonset pod in namespace gpu-operator")


def test_dra_readiness_checks_named_operands_not_the_looping_validator(operator, api):
    # The validator's plugin-validation init container waits for nvidia.com/gpu capacity, which a dra node never
    # gets: it loops there. It must not block readiness; the DRA kubelet plugin pod must be Ready.
    operator.add_pod("gpu-operator", "nvidia-operator-validator-n1", node="n1", phase="Pending", waiting="PodInitializing")
    assert operator_ready(api, "n1", "gpu-operator", "dra", DRIVER, dra_namespace="dra") == [
        "node n1: no DRA kubelet plugin pod in namespace dra"]
    plugin = operator.add_pod("dra", "nvidia-dra-driver-gpu-kubelet-plugin-x1", node="n1", ready=False,
                              waiting="ContainerCreating")
    assert operator_ready(api, "n1", "gpu-operator", "dra", DRIVER, dra_namespace="dra") == [
        "node n1: pod dra/nvidia-dra-driver-gpu-kubelet-plugin-x1 is Running (main: ContainerCreating)"]
    plugin["status"]["containerStatuses"][0].update(ready=True, state={"running": {}})
    operator.pods[("gpu-operator", "nvidia-container-toolkit-daemonset-n1")]["status"]["phase"] = "Pending"
    assert operator_ready(api, "n1", "gpu-operator", "dra", DRIVER, dra_namespace="dra") == [
        "node n1: pod gpu-operator/nvidia-container-toolkit-daemonset-n1 is Pending"]


def test_operator_ready_checks_the_device_plugin_resource_name(operator, api):
    assert operator_ready(api, "n2", "gpu-operator", "device-plugin", resource="example.com/gpu") == [
        "node n2: example.com/gpu allocatable is 0 (device plugin not serving)"]
    operator.nodes["n2"]["status"]["allocatable"]["example.com/gpu"] = "2"
    assert operator_ready(api, "n2", "gpu-operator", "device-plugin", resource="example.com/gpu") == []


def test_preflight_sees_double_offering_under_the_device_plugin_resource_name(dra_cluster, api):
    dra_cluster.nodes["n1"]["status"]["allocatable"]["vendor.example/gpu"] = "1"
    assert kube_preflight.preflight(api, DRIVER, ER, ["n1"], ["n1", "n2"]) == []
    problems = kube_preflight.preflight(api, DRIVER, ER, ["n1"], ["n1", "n2"], device_plugin_resource="vendor.example/gpu")
    assert problems and "GPUs offered twice" in problems[0] and "vendor.example/gpu" in problems[0]


def test_operator_readiness_provider_waits_then_fails_with_problems(operator, kube, kubeconfig):
    provider = _OperatorReadinessProvider()
    driver_pod = operator.pods[("gpu-operator", "nvidia-driver-daemonset-n2")]
    driver_pod["status"]["phase"] = "Pending"
    kube.after(2, "gpu-operator/pods", lambda: driver_pod["status"].update(phase="Running"))
    assert create(provider, kubeconfig, node="n2", stage="device-plugin", namespace="gpu-operator", **FAST)["ready"]
    with pytest.raises(CheckFailed) as e:
        create(provider, kubeconfig, node="n1", stage="device-plugin", namespace="gpu-operator", **SHORT)
    assert str(e.value) == ("GPU Operator on node n1 (device-plugin) did not pass within 0s:\n"
                            "  - node n1: nvidia.com/gpu allocatable is 0 (device plugin not serving)")


# --- rollback: drain, labels (lead's NodePatch), verification ------------------------------------------------------


def drain(kubeconfig, **timing):
    return create(_NodeDrainProvider(), kubeconfig, node="n1", pilot_label=PILOT, extended_resource=ER,
                  **(timing or FAST))


def test_drain_is_a_no_op_without_the_pilot_label(kube, kubeconfig):
    kube.add_node("n1")
    assert drain(kubeconfig)["rolling_back"] is False
    assert "unschedulable" not in kube.nodes["n1"]["spec"]
    assert [m for m, _ in kube.requests] == ["GET"]


def test_drain_cordons_and_waits_for_gpu_pods(dra_cluster, kube, kubeconfig):
    training = kube.add_pod("ml", "training", node="n1", requests={ER: "1"})
    kube.add_pod("kube-system", "dns", node="n1")  # no GPU: not waited for
    kube.add_pod("ml", "done", node="n1", phase="Succeeded", requests={ER: "1"})
    kube.after(2, "/api/v1/pods", lambda: training["status"].update(phase="Succeeded"))
    assert drain(kubeconfig)["rolling_back"] is True
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True
    assert training["status"]["phase"] == "Succeeded"


def test_drain_waits_for_pods_with_resource_claims_and_times_out_naming_them(dra_cluster, kube, kubeconfig):
    kube.add_pod("ml", "training", node="n1", requests={ER: "1"})
    claimed = kube.add_pod("ml", "inference", node="n1")
    claimed["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "inference-gpu"}]
    with pytest.raises(CheckFailed) as e:
        drain(kubeconfig, **SHORT)
    assert "waiting for GPU pods on node n1 to finish" in str(e.value)
    assert "GPU pods still running: ml/inference, ml/training" in str(e.value)
    assert "node n1 is left cordoned" in str(e.value)
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


def test_api_error_during_the_drain_wait_still_says_the_node_is_left_cordoned(dra_cluster, kube, kubeconfig,
                                                                              monkeypatch):
    kube.add_pod("ml", "training", node="n1", requests={ER: "1"})
    calls = []
    real = cluster.gpu_pods

    def flaky(*args):
        calls.append(args)
        if len(calls) > 1:
            raise ApiException(status=500, reason="Internal Server Error")
        return real(*args)

    monkeypatch.setattr(cluster, "gpu_pods", flaky)
    with pytest.raises(CheckFailed) as e:
        drain(kubeconfig)
    message = str(e.value)
    assert "reading the GPU pods on node n1 failed while waiting for them to finish: HTTP 500" in message
    assert "node n1 is left cordoned with its labels unchanged; run `pulumi up` again to continue" in message
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


def rollback(kubeconfig, rolling_back=True, **timing):
    return create(_RollbackVerificationProvider(), kubeconfig, node="n1", rolling_back=rolling_back,
                  extended_resource=ER, image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", namespace=NS,
                  **(timing or FAST))


# --- fence for nodes still on IBM-managed drivers ------------------------------------------------------------------

FENCE = {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}


def fence(kubeconfig, node):
    return create(_NodeFenceProvider(), kubeconfig, node=node, labels=FENCE,
                  operator_min_version="1.36")


def test_fence_labels_only_nodes_on_ibm_kubelets(kube, kubeconfig):
    kube.add_node("old", kubelet_version="v1.35.4+IKS")
    kube.add_node("new", kubelet_version="v1.36.1+IKS")
    assert fence(kubeconfig, "old")["fenced"] is True
    assert {k: kube.nodes["old"]["metadata"]["labels"].get(k) for k in FENCE} == FENCE
    assert fence(kubeconfig, "new")["fenced"] is False
    assert not FENCE.keys() & kube.nodes["new"]["metadata"]["labels"].keys()
    assert fence(kubeconfig, "gone")["fenced"] is False  # already replaced under another name


def test_fence_of_an_ibm_managed_node_refuses_a_replaced_or_missing_node(kube, kubeconfig):
    kube.add_node("old", kubelet_version="v1.35.4+IKS")
    kube.add_node("new", kubelet_version="v1.37.0+IKS")
    ibm = dict(labels=FENCE, operator_min_version="1.36", stage="ibm-managed")
    assert create(_NodeFenceProvider(), kubeconfig, node="old", **ibm)["fenced"] is True
    with pytest.raises(CheckFailed, match="node new is set to stage ibm-managed but runs kubelet v1.37.0"):
        create(_NodeFenceProvider(), kubeconfig, node="new", **ibm)
    assert "nvidia.com/gpu.deploy.operands" not in kube.nodes["new"]["metadata"]["labels"]  # untouched
    with pytest.raises(CheckFailed, match=r"node typo \(stage ibm-managed in gpu-migration:nodes\) matches no node"):
        create(_NodeFenceProvider(), kubeconfig, node="typo", **ibm)


# --- GPU node inventory, operand placement, pending GPU pods ---------------------------------------------------------

IKS_GPU = {"ibm-cloud.kubernetes.io/machine-type": "gx3.16x80.l4"}


def inventory(api, configured, worker_ids=None, temp_pool=None, seen=None):
    found = kube_inventory.inventory(api, configured, worker_ids or {}, "1.36", temp_pool, seen)
    return found.problems, found.warnings


POOL_A = {"ibm-cloud.kubernetes.io/worker-pool-name": "gpu", "ibm-cloud.kubernetes.io/zone": "us-south-1"}


def test_inventory_names_unlisted_gpu_nodes_and_missing_config_names(kube, api):
    kube.add_node("a", allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")
    kube.add_node("b", labels=IKS_GPU, kubelet_version="v1.35.4+IKS")  # GPU flavor, no driver yet
    kube.add_node("cpu", labels={"ibm-cloud.kubernetes.io/machine-type": "bx2.4x16"})
    problems, warnings = inventory(api, {"a": "ibm-managed", "gone": "ibm-managed", "typo": "device-plugin"})
    assert problems == [
        "GPU node b (kubelet v1.35.4+IKS, flavor gx3.16x80.l4, worker pool ?, zone ?) is not listed in "
        "gpu-migration:nodes: it runs IBM-managed drivers and would get the GPU Operator next to them; add it with "
        "stage ibm-managed ({name: b, workerId: ?, stage: ...})",
        "node gone in gpu-migration:nodes (stage ibm-managed) matches no node in the cluster; fix its name "
        "(`kubectl get nodes`)",
        "node typo in gpu-migration:nodes (stage device-plugin) matches no node in the cluster and no earlier run saw "
        "it; fix its name (`kubectl get nodes`)"]
    assert warnings == []


def test_an_unlisted_node_past_ibm_drivers_is_a_problem_unless_it_is_a_listed_nodes_new_worker(kube, api):
    kube.add_node("10.0.0.9", labels={**IKS_GPU, **POOL_A, "ibm-cloud.kubernetes.io/worker-id": "w-new"},
                  kubelet_version="v1.37.0+IKS")
    # No earlier run saw 10.0.0.1: a stray GPU node and a wrong name, both named.
    problems, warnings = inventory(api, {"10.0.0.1": "dra"})
    assert problems == [
        "GPU node 10.0.0.9 (kubelet v1.37.0+IKS, flavor gx3.16x80.l4, worker pool gpu, zone us-south-1) is not listed "
        "in gpu-migration:nodes, and it is not the new worker of a listed node whose replacement is under way (none "
        "in that pool and zone); add it with its stage ({name: 10.0.0.9, workerId: w-new, stage: ...}), or remove "
        "it from the cluster",
        "node 10.0.0.1 in gpu-migration:nodes (stage dra) matches no node in the cluster and no earlier run saw it; "
        "fix its name (`kubectl get nodes`)"]
    # An earlier run saw 10.0.0.1 in another zone: still not its new worker.
    elsewhere = {"10.0.0.1": {"pool": "gpu", "zone": "us-south-2"}}
    assert len(inventory(api, {"10.0.0.1": "dra"}, seen=elsewhere)[0]) == 1
    # Same pool and zone: an interrupted replacement; both only warn, so `up` resumes it.
    there = {"10.0.0.1": {"pool": "gpu", "zone": "us-south-1"}}
    problems, warnings = inventory(api, {"10.0.0.1": "dra"}, seen=there)
    assert problems == [] and warnings == [
        "GPU node 10.0.0.9 (kubelet v1.37.0+IKS, flavor gx3.16x80.l4, worker pool gpu, zone us-south-1) is not listed "
        "in gpu-migration:nodes; taken for the new worker of 10.0.0.1 (same pool and zone, whose node is gone): the "
        "resumed replacement of 10.0.0.1 records it"]
    # One new worker explains one entry, not two.
    kube.add_node("10.0.0.8", labels={**IKS_GPU, **POOL_A}, kubelet_version="v1.37.0+IKS")
    assert len(inventory(api, {"10.0.0.1": "dra"}, seen=there)[0]) == 1
    del kube.nodes["10.0.0.8"]
    # The node is gone and no new worker joined yet: the replacement is under way.
    del kube.nodes["10.0.0.9"]
    assert inventory(api, {"10.0.0.1": "dra"}, seen=there) == ([], [
        "node 10.0.0.1 in gpu-migration:nodes (stage dra) is gone since an earlier run saw it and no new worker has "
        "joined yet: its replacement resumes"])
    # An ibm-managed entry is never explained by a replacement: its node would stay unfenced.
    assert len(inventory(api, {"10.0.0.1": "ibm-managed"}, seen=there)[0]) == 1


def test_inventory_ties_replaced_nodes_to_their_config_entry(kube, api):
    kube.add_node("10.0.0.9", labels={**IKS_GPU, "ibm-cloud.kubernetes.io/worker-id": "w-new"},
                  kubelet_version="v1.37.0+IKS")
    kube.nodes["10.0.0.9"]["metadata"]["annotations"] = {CONFIG_NAME_ANNOTATION: "10.0.0.1"}
    assert inventory(api, {"10.0.0.1": "dra"}) == ([], [])
    # Its entry's workerId set to the new worker, and the node tied to it: fine.
    assert inventory(api, {"10.0.0.1": "dra"}, worker_ids={"w-new": "10.0.0.1"}) == ([], [])
    kube.nodes["10.0.0.9"]["metadata"]["annotations"] = {}
    kube.nodes["10.0.0.9"]["metadata"]["labels"]["ibm-cloud.kubernetes.io/worker-pool-name"] = "tmp"
    # An entry whose own worker's node has another name: a wrong name, not a replacement.
    kube.nodes["10.0.0.9"]["metadata"]["labels"]["ibm-cloud.kubernetes.io/worker-id"] = "w-old"
    assert inventory(api, {"10.0.0.1": "ibm-managed"}, worker_ids={"w-old": "10.0.0.1"})[0] == [
        "node 10.0.0.1 in gpu-migration:nodes has workerId w-old, whose node is 10.0.0.9; set its name to 10.0.0.9"]
    # The temporary pool's GPU node is ours, listed or not.
    assert len(inventory(api, {})[0]) == 1
    assert inventory(api, {}, temp_pool="tmp") == ([], [])


def test_inventory_provider_fails_before_anything_is_installed(kube, kubeconfig):
    kube.add_node("stray", allocatable={"nvidia.com/gpu": "2"}, kubelet_version="v1.35.4+IKS")
    with pytest.raises(CheckFailed, match="nothing was installed:\n  - GPU node stray"):
        create(_GpuNodeInventoryProvider(), kubeconfig, configured={}, worker_ids={},
               operator_min_version="1.36")


def test_operand_placement_names_node_and_pods(kube, kubeconfig):
    kube.add_pod("gpu-operator", "nvidia-driver-daemonset-x1", node="ibm1")
    kube.add_pod("gpu-operator", "nvidia-dcgm-exporter-x2", node="ibm1")
    kube.add_pod("gpu-operator", "gpu-feature-discovery-x3", node="ibm1")  # not one the runbook checks
    kube.add_pod("gpu-operator", "nvidia-driver-daemonset-x4", node="new1")
    with pytest.raises(CheckFailed) as e:
        create(_OperandPlacementProvider(), kubeconfig, namespace="gpu-operator", fenced=["ibm1"])
    assert ("node ibm1: runs IBM-managed drivers but has GPU Operator pods gpu-operator/nvidia-dcgm-exporter-x2, "
            "gpu-operator/nvidia-driver-daemonset-x1") in str(e.value)
    assert "new1" not in str(e.value)
    assert create(_OperandPlacementProvider(), kubeconfig, namespace="gpu-operator",
                  fenced=["ibm2"])["checked"] == ["ibm2"]


def test_operand_placement_ignores_a_new_worker_that_got_a_fenced_name_again(kube, kubeconfig):
    """A replaced node's fence stays in state under its old name; VPC hands the freed IP (the node name) to a later
    worker, which runs the GPU Operator by design."""
    kube.add_node("10.0.0.11", kubelet_version="v1.37.0+IKS")  # a new worker that got the old IP
    kube.add_node("10.0.0.13", kubelet_version="v1.35.4+IKS")  # still on IBM's drivers
    for node in ("10.0.0.11", "10.0.0.13"):
        kube.add_pod("gpu-operator", f"nvidia-driver-daemonset-{node}", node=node)
    with pytest.raises(CheckFailed) as e:
        create(_OperandPlacementProvider(), kubeconfig, namespace="gpu-operator",
               fenced=["10.0.0.11", "10.0.0.13"], operator_min_version="1.36")
    assert "node 10.0.0.13: runs IBM-managed drivers" in str(e.value) and "10.0.0.11" not in str(e.value)


def test_pending_gpu_pods_reported_or_gated(kube, kubeconfig):
    kube.add_pod("ml", "train", phase="Pending", requests={"nvidia.com/gpu": "1"}, conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    kube.add_pod("web", "frontend", phase="Pending")  # no GPU: not reported
    props = dict(node="n1", resources=["nvidia.com/gpu"])
    outs = create(_PendingGpuPodsProvider(), kubeconfig, gate=False, **props)
    assert outs["pending"] == ["ml/train (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)"]
    with pytest.raises(CheckFailed, match="after node n1, GPU pods are still Pending"):
        create(_PendingGpuPodsProvider(), kubeconfig, gate=True, **props)


@pytest.fixture
def rolled_back(kube):
    """n1 after the label switch: cordoned, device plugin not yet serving; pods it gets run like `nvidia-smi -L`."""
    kube.add_node("n1")["spec"]["unschedulable"] = True
    created = []

    def run(pod):
        created.append(pod)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        pod["spec"]["nodeName"] = pod["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        pod["status"] = {"phase": "Succeeded"}
        kube.logs[key] = f"GPU 0: NVIDIA A100 (UUID: {UUID0})\n"

    kube.on_pod_create = run
    kube.after(2, "nodes/n1", lambda: kube.nodes["n1"]["status"]["allocatable"].update({ER: "1"}))
    return created


def test_rollback_verification_passes_and_uncordons(kube, kubeconfig, rolled_back):
    outs = rollback(kubeconfig)
    assert outs["gpu_uuid"] == UUID0 and outs["result"].startswith("passed")
    assert "unschedulable" not in kube.nodes["n1"]["spec"]
    [pod] = rolled_back
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {ER: "1"}
    assert pod["spec"]["tolerations"][0]["key"] == "node.kubernetes.io/unschedulable"
    assert not kube.pods  # the check pod was deleted
    assert annotation(kube) | {"checkedAt": None} == {
        "path": "device-plugin", "result": "passed", "gpu": UUID0, "checkedAt": None}


def test_rollback_verification_failure_leaves_node_cordoned(kube, kubeconfig, rolled_back):
    previous = kube.on_pod_create
    kube.on_pod_create = lambda pod: (previous(pod), pod["status"].update(phase="Failed"),
                                      kube.logs.update({(NS, pod["metadata"]["name"]): "no devices found"}))
    with pytest.raises(CheckFailed) as e:
        rollback(kubeconfig)
    message = str(e.value)
    assert "rollback of node n1 to the device plugin failed" in message and "node n1 is left cordoned" in message
    assert "phase Failed" in message and "logs name no GPU UUID" in message
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True
    assert not kube.pods
    assert annotation(kube)["result"] == "failed"


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), Interrupted("shutting down"),
                                          ApiException(status=500, reason="boom")])
def test_interrupted_rollback_check_leaves_no_pod(kube, kubeconfig, rolled_back, monkeypatch, interruption):
    def interrupt(*_):
        raise interruption
    monkeypatch.setattr(cluster, "pod_log", interrupt)
    with pytest.raises(type(interruption)):
        rollback(kubeconfig)
    assert len(rolled_back) == 1 and not kube.pods
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


def test_rollback_check_deletes_a_pod_left_by_a_killed_run_and_bounds_its_own(kube, kubeconfig, rolled_back):
    left = kube.add_pod(NS, "gpu-rollback-check-n1-old", node="n1", phase="Running", requests={ER: "1"})
    left["metadata"]["labels"] = {"app.kubernetes.io/name": "gpu-rollback-check",
                                  ROLLBACK_NODE_LABEL: "n1"}
    other = kube.add_pod(NS, "gpu-rollback-check-n2-old", node="n2", phase="Running")
    other["metadata"]["labels"] = {"app.kubernetes.io/name": "gpu-rollback-check",
                                   ROLLBACK_NODE_LABEL: "n2"}
    rollback(kubeconfig)
    assert list(kube.pods) == [(NS, "gpu-rollback-check-n2-old")]  # only n1's leftover, and our own, are gone
    [pod] = rolled_back
    assert pod["spec"]["activeDeadlineSeconds"] == 2  # FAST timeout: a pod orphaned by SIGKILL still stops


def test_failing_to_record_does_not_hide_the_rollback_failure(kube, kubeconfig, rolled_back, monkeypatch):
    kube.on_pod_create = lambda pod: pod.update(status={"phase": "Failed"})
    kube.nodes["n1"]["status"]["allocatable"][ER] = "1"
    failing_patch_node(monkeypatch)
    with pytest.raises(CheckFailed) as e:
        rollback(kubeconfig)
    message = str(e.value)
    assert "rollback of node n1 to the device plugin failed" in message and "phase Failed" in message
    assert "node n1 is left cordoned" in message and "could not be recorded on node n1" in message
    assert not kube.pods


def test_rollback_verification_times_out_when_device_plugin_never_serves(kube, kubeconfig):
    kube.add_node("n1")["spec"]["unschedulable"] = True
    with pytest.raises(CheckFailed) as e:
        rollback(kubeconfig, **SHORT)
    assert "device plugin to offer example.com/gpu on node n1" in str(e.value) and "left cordoned" in str(e.value)
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True and not kube.pods


def test_rollback_verification_is_a_no_op_when_not_rolling_back(kube, kubeconfig):
    assert rollback(kubeconfig, rolling_back=False)["result"] == "not rolling back"
    assert kube.requests == []


# --- the Resources declare and their providers serialize ------------------------------------------------------------


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self):
        self.resources = {}

    def new_resource(self, args):
        self.resources[args.name] = args
        return f"{args.name}-id", {**args.inputs, "rolling_back": True, "gpu_uuid": UUID0}

    def call(self, args):
        return {}


def test_resources_declare_and_providers_serialize():
    mocks = _Mocks()
    pulumi.runtime.set_mocks(mocks, preview=False)
    common = dict(kubeconfig=None, timeout=60, poll_interval=1)
    declared = [
        DraPreflight("pre", driver=DRIVER, extended_resource=ER, dra_nodes=["n1"],
                                    all_nodes=["n1", "n2"], **common),
        SmokeTestVerification("smoke", namespace=NS, pod_name="gpu-smoke-n1",
                                             pod_uid=pulumi.Output.from_input("uid-1"), node="n1", driver=DRIVER,
                                             extended_resource=ER, **common),
        OperatorReadiness("ready", node="n1", stage="dra", namespace="gpu-operator", **common),
    ]
    drain_ = NodeDrain("drain", node="n1", pilot_label=PILOT, extended_resource=ER, **common)
    declared += [drain_, RollbackVerification(
        "rollback", node="n1", rolling_back=drain_.rolling_back, extended_resource=ER, image="cuda", namespace=NS,
        **common)]
    declared += [
        NodePathSwitch("switch", kubeconfig=None, node="n1", target="dra", pilot_label=PILOT,
                                   device_plugin_resource="nvidia.com/gpu", extended_resource=ER, driver=DRIVER,
                                   drain_timeout=60, switch_timeout=60, poll_interval=1),
        GpuNodeInventory("inventory", kubeconfig=None, configured={"n1": "dra"}, worker_ids={},
                                        operator_min_version="1.36"),
        OperandPlacement("placement", kubeconfig=None, namespace="gpu-operator", fenced=["n2"]),
        PendingGpuPods("pending", kubeconfig=None, node="n1", resources=[ER], gate=False),
    ]
    expected = {"pre": "_DraPreflightProvider", "smoke": "_SmokeTestVerificationProvider",
                "ready": "_OperatorReadinessProvider", "drain": "_NodeDrainProvider",
                "rollback": "_RollbackVerificationProvider", "switch": "_NodePathSwitchProvider",
                "inventory": "_GpuNodeInventoryProvider", "placement": "_OperandPlacementProvider",
                "pending": "_PendingGpuPodsProvider"}

    def check(values):
        rolling_back, gpu_uuid, _ = values
        assert (rolling_back, gpu_uuid) == (True, UUID0)
        assert set(mocks.resources) == set(expected)
        for name, cls in expected.items():
            args = mocks.resources[name]
            assert args.typ.startswith("pulumi-python:dynamic/gpu-migration:")
            serialized = args.inputs["__provider"]  # a secret: {<secret sig>: ..., "value": <base64 dill>}
            provider = dill.loads(base64.b64decode(serialized["value"] if isinstance(serialized, dict) else serialized))
            assert type(provider).__name__ == cls
        assert mocks.resources["rollback"].inputs["rolling_back"] is True

    return pulumi.Output.all(drain_.rolling_back, declared[1].gpu_uuid, declared[4].result).apply(check)


test_resources_declare_and_providers_serialize = pulumi.runtime.test(test_resources_declare_and_providers_serialize)


def test_cancelled_up_deletes_the_rollback_check_pod(kube, kubeconfig):
    """SIGINT to the provider process while the check pod runs (poll interval 30s): the worker notices the shutdown
    instead of sleeping on, deletes the pod and the process exits (the engine would SIGKILL it after 5s; the wait
    below is only a hang guard)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    kube.add_node("n1", allocatable={ER: "1"})["spec"]["unschedulable"] = True  # pods it gets stay Running
    kube.on_pod_create = lambda pod: pod["status"].update(phase="Running")
    host = subprocess.Popen([sys.executable, str(Path(__file__).parent / "provider_host.py"), kubeconfig],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert host.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 30
        while not kube.pods and time.monotonic() < deadline:  # the check pod is up
            time.sleep(0.05)
        assert kube.pods, host.stderr.read() if host.poll() is not None else "no check pod created"
        host.send_signal(signal.SIGINT)
        host.wait(timeout=60)
    finally:
        if host.poll() is None:
            host.kill()
    assert not kube.pods
    assert [p for m, p in kube.requests if m == "DELETE"] == [
        f"/api/v1/namespaces/{NS}/pods/gpu-rollback-check-n1-00001"]


def test_inventory_and_placement_run_again_on_every_up(kube, kubeconfig):
    kube.add_node("a", allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")
    provider = _GpuNodeInventoryProvider()
    props = dict(kubeconfig=kubeconfig, configured={"a": "ibm-managed"}, worker_ids={}, operator_min_version="1.36")
    olds = provider.create(props).outs
    diff = provider.diff("id", olds, props)
    assert diff.changes and not diff.replaces  # an update, not a replacement
    kube.add_node("b", allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")  # joined since
    with pytest.raises(CheckFailed, match="GPU node b"):
        provider.update("id", olds, props)
    del kube.nodes["b"]
    outs = provider.update("id", olds, props).outs
    assert outs["checked"] == ["a"] and outs["seen"] == {"a": {"pool": "", "zone": ""}}


def test_a_batch_preflight_lets_dra_nodes_of_other_batches_publish(dra_cluster, api):
    # n1 (pilot label, slices) is a dra node of an earlier batch; the check covers batch [n3] only.
    dra_cluster.add_node("n3", labels={"migration.example.com/gpu-dra": "pilot"})
    dra_cluster.add_slice("n3", DRIVER, {"gpu-1": "GPU-1"})
    pilot = "migration.example.com/gpu-dra=pilot"
    assert kube_preflight.preflight(api, DRIVER, ER, ["n3"], ["n3"], pilot_label=pilot) == []
    # A publisher without the pilot label, or a node of the batch that is not dra, is still refused.
    dra_cluster.nodes["n1"]["metadata"]["labels"].pop("migration.example.com/gpu-dra")
    assert kube_preflight.preflight(api, DRIVER, ER, ["n3"], ["n3"], pilot_label=pilot) == [
        f"node n1: publishes 1 DRA devices of driver {DRIVER} but is not a dra node"]
    assert kube_preflight.preflight(api, DRIVER, ER, [], ["n3"], pilot_label=pilot) == [
        f"node n1: publishes 1 DRA devices of driver {DRIVER} but is not a dra node",
        f"node n3: publishes 1 DRA devices of driver {DRIVER} but is not a dra node"]
