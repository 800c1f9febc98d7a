"""The kube checks and dynamic providers, driving the real kubernetes client against tests/emulators/kube.py."""
import base64
import json

import dill
import pulumi
import pytest
from kubernetes import config as kube_config

from iks_gpu_migration import kube_checks, kube_providers, status
from iks_gpu_migration.kube_providers import VERIFICATION_ANNOTATION, CheckFailed
from tests.emulators.kube import KubeEmulator, openapi_resource_v1

DRIVER, ER, NS = "gpu.example.com", "example.com/gpu", "gpu-pilot"
PILOT = "migration.example.com/gpu-dra=pilot"
UUID0, UUID1 = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-9f8e7d6c-0000-1111-2222-333344445555"
FAST = {"timeout": 2, "poll_interval": 0.02}
SHORT = {"timeout": 0.3, "poll_interval": 0.02}


@pytest.fixture
def kube():
    emulator = KubeEmulator().start()
    yield emulator
    emulator.stop()


@pytest.fixture
def kubeconfig(kube, tmp_path):
    return kube.write_kubeconfig(tmp_path / "kubeconfig")


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
    return kube_checks.preflight(api, DRIVER, ER, list(dra_nodes), ["n1", "n2"])


def test_preflight_waits_for_slices_then_passes(kube, kubeconfig):
    kube.add_node("n1")
    kube.add_node("n2", allocatable={"nvidia.com/gpu": "1"})
    kube.after(2, "resourceslices", lambda: kube.add_slice("n1", DRIVER, {"gpu-0": UUID0}))
    outs = create(kube_providers._DraPreflightProvider(), kubeconfig, driver=DRIVER, extended_resource=ER,
                  dra_nodes=["n1"], all_nodes=["n1", "n2"], **FAST)
    assert outs["checked_nodes"] == ["n1"]
    assert sum(1 for _, p in kube.requests if "resourceslices" in p) == 3  # it polled until the slice appeared


def test_preflight_fails_without_extended_resource_name(dra_cluster, api):
    dra_cluster.openapi["apis/resource.k8s.io/v1"] = openapi_resource_v1(extended_resource_name=False)
    assert preflight(api) == [
        "API server OpenAPI apis/resource.k8s.io/v1 has no "
        "io.k8s.api.resource.v1.DeviceClassSpec.extendedResourceName: "
        "DRA extended resources (feature gate DRAExtendedResource) are not available"
    ]
    dra_cluster.openapi.clear()
    assert "DRA (resource.k8s.io/v1) is not served" in preflight(api)[0]


def test_preflight_fails_listing_dra_node_without_slices(dra_cluster, kubeconfig):
    with pytest.raises(CheckFailed) as e:
        create(kube_providers._DraPreflightProvider(), kubeconfig, driver=DRIVER, extended_resource=ER,
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


def verify(api):
    return kube_checks.verify_smoke(api, NS, "gpu-smoke-n1", "n1", DRIVER, ER)


def verification(kubeconfig, pod, **timing):
    return create(kube_providers._SmokeTestVerificationProvider(), kubeconfig, namespace=NS, pod_name="gpu-smoke-n1",
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
        "device": "gpu.example.com/n1/gpu-0", "problems": [], "checkedAt": None}


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
        f"allocated device gpu.example.com/n1/gpu-0 is {UUID0}"]


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
    assert str(e.value) == ("smoke test gpu-pilot/gpu-smoke-n1 on node n1 failed:\n  - criterion 4 (GPU operation): "
                            "pod gpu-pilot/gpu-smoke-n1 phase Failed, containers: ['main exit 3 (Error)']")
    assert annotation(kube)["problems"] == [str(e.value).split("  - ")[1]]


def test_smoke_verification_waits_for_the_expected_pod_uid(smoke, kubeconfig):
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, {"metadata": {"uid": "other-uid"}}, **SHORT)
    assert "pod gpu-pilot/gpu-smoke-n1 to finish" in str(e.value) and "expected other-uid" in str(e.value)


def test_smoke_verification_reruns_only_when_the_pod_changes():
    provider = kube_providers._SmokeTestVerificationProvider()
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
        dra_cluster.add_pod("gpu-operator", f"nvidia-cuda-validator-{node}", node=node, phase="Succeeded", exit_code=0)
    return dra_cluster


def test_operator_ready_on_both_paths(operator, api):
    assert kube_checks.operator_ready(api, "n2", "gpu-operator", "device-plugin") == []
    assert kube_checks.operator_ready(api, "n1", "gpu-operator", "dra", DRIVER) == []


def test_operator_not_ready_lists_pods_and_gpus(operator, api):
    operator.add_pod("gpu-operator", "nvidia-device-plugin-daemonset-n2", node="n2", waiting="CrashLoopBackOff")
    operator.nodes["n2"]["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    assert kube_checks.operator_ready(api, "n2", "gpu-operator", "device-plugin") == [
        "node n2: pod gpu-operator/nvidia-device-plugin-daemonset-n2 is Running (main: CrashLoopBackOff)",
        "node n2: nvidia.com/gpu allocatable is 0 (device plugin not serving)"]
    operator.slices.clear()
    assert kube_checks.operator_ready(api, "n1", "gpu-operator", "dra", DRIVER) == [
        "node n1: no DRA devices in ResourceSlices of driver gpu.example.com"]
    assert kube_checks.operator_ready(api, "n3", "gpu-operator", "dra")[0] == (
        "node n3: no GPU Operator pods in namespace gpu-operator")


def test_operator_ready_checks_the_device_plugin_resource_name(operator, api):
    assert kube_checks.operator_ready(api, "n2", "gpu-operator", "device-plugin", resource="example.com/gpu") == [
        "node n2: example.com/gpu allocatable is 0 (device plugin not serving)"]
    operator.nodes["n2"]["status"]["allocatable"]["example.com/gpu"] = "2"
    assert kube_checks.operator_ready(api, "n2", "gpu-operator", "device-plugin", resource="example.com/gpu") == []


def test_preflight_sees_double_offering_under_the_device_plugin_resource_name(dra_cluster, api):
    dra_cluster.nodes["n1"]["status"]["allocatable"]["vendor.example/gpu"] = "1"
    assert kube_checks.preflight(api, DRIVER, ER, ["n1"], ["n1", "n2"]) == []
    problems = kube_checks.preflight(api, DRIVER, ER, ["n1"], ["n1", "n2"], device_plugin_resource="vendor.example/gpu")
    assert problems and "GPUs offered twice" in problems[0] and "vendor.example/gpu" in problems[0]


def test_operator_readiness_provider_waits_then_fails_with_problems(operator, kube, kubeconfig):
    provider = kube_providers._OperatorReadinessProvider()
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
    return create(kube_providers._NodeDrainProvider(), kubeconfig, node="n1", pilot_label=PILOT, extended_resource=ER,
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
    with pytest.raises(kube_providers.CheckFailed) as e:
        drain(kubeconfig, **SHORT)
    assert "waiting for GPU pods on node n1 to finish" in str(e.value)
    assert "GPU pods still running: ml/inference, ml/training" in str(e.value)
    assert "node n1 is left cordoned" in str(e.value)
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


def rollback(kubeconfig, rolling_back=True, **timing):
    return create(kube_providers._RollbackVerificationProvider(), kubeconfig, node="n1", rolling_back=rolling_back,
                  extended_resource=ER, image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", namespace=NS,
                  **(timing or FAST))


# --- fence for nodes still on IBM-managed drivers ------------------------------------------------------------------

FENCE = {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}


def fence(kubeconfig, node):
    return create(kube_providers._NodeFenceProvider(), kubeconfig, node=node, labels=FENCE,
                  operator_min_version="1.36")


def test_fence_labels_only_nodes_on_ibm_kubelets(kube, kubeconfig):
    kube.add_node("old", kubelet_version="v1.35.4+IKS")
    kube.add_node("new", kubelet_version="v1.36.1+IKS")
    assert fence(kubeconfig, "old")["fenced"] is True
    assert {k: kube.nodes["old"]["metadata"]["labels"].get(k) for k in FENCE} == FENCE
    assert fence(kubeconfig, "new")["fenced"] is False
    assert not FENCE.keys() & kube.nodes["new"]["metadata"]["labels"].keys()
    assert fence(kubeconfig, "gone")["fenced"] is False  # already replaced under another name


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


def test_rollback_verification_times_out_when_device_plugin_never_serves(kube, kubeconfig):
    kube.add_node("n1")["spec"]["unschedulable"] = True
    with pytest.raises(CheckFailed) as e:
        rollback(kubeconfig, **SHORT)
    assert "device plugin to offer example.com/gpu on node n1" in str(e.value) and "left cordoned" in str(e.value)
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True and not kube.pods


def test_rollback_verification_is_a_no_op_when_not_rolling_back(kube, kubeconfig):
    assert rollback(kubeconfig, rolling_back=False)["result"] == "not rolling back"
    assert kube.requests == []


# --- status command ------------------------------------------------------------------------------------------------


def test_status_table(dra_cluster, kube, kubeconfig, tmp_path, capsys):
    (tmp_path / "Pulumi.pilot.yaml").write_text(
        "config:\n"
        "  gpu-migration:clusterName: pilot\n"
        "  gpu-migration:nodes:\n"
        "    - {name: n1, workerId: w1, stage: dra}\n"
        "    - {name: n2, workerId: w2, stage: device-plugin}\n"
        "    - {name: n3, workerId: w3, stage: ibm-managed}\n"
    )
    n1 = kube.nodes["n1"]
    n1["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] = "false"
    n1["metadata"]["annotations"] = {VERIFICATION_ANNOTATION: json.dumps(
        {"path": "dra", "result": "passed", "gpu": UUID0, "checkedAt": "2026-12-02T12:00:00Z"})}
    kube.nodes["n2"]["spec"]["unschedulable"] = True
    assert status.main(["--stack", "pilot", "--kubeconfig", kubeconfig, "--project-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NODE", "STAGE", "LABELS", "CORDONED", "VERIFICATION"]
    assert lines[1].split() == ["n1", "dra", "migration.example.com/gpu-dra=pilot,",
                                "nvidia.com/gpu.deploy.device-plugin=false", "no", "passed", "(dra,",
                                "2026-12-02T12:00:00Z)", UUID0]
    assert lines[2].split() == ["n2", "device-plugin", "-", "yes", "-"]
    assert lines[3].split() == ["n3", "ibm-managed", "node", "not", "found", "-", "-"]


def test_status_reads_replaced_nodes_under_the_name_recorded_in_state(dra_cluster, kube, kubeconfig, tmp_path, capsys):
    """Issue 10 point 11: after a replacement the config still names the old node; the outputs name the new one."""
    (tmp_path / "Pulumi.pilot.yaml").write_text(
        "config:\n"
        "  gpu-migration:nodes:\n"
        "    - {name: old-n2, workerId: w2, stage: device-plugin}\n"
    )
    kube.nodes["n2"]["spec"]["unschedulable"] = True
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"node:old-n2": {"stage": "device-plugin", "workerId": "w2",
                                                   "replacedWorkerId": "w2-new", "nodeName": "n2"}}))
    assert status.main(["--stack", "pilot", "--kubeconfig", kubeconfig, "--project-dir", str(tmp_path),
                        "--outputs", str(outputs)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["old-n2->n2", "device-plugin", "-", "yes", "-"]


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
        kube_providers.DraPreflight("pre", driver=DRIVER, extended_resource=ER, dra_nodes=["n1"],
                                    all_nodes=["n1", "n2"], **common),
        kube_providers.SmokeTestVerification("smoke", namespace=NS, pod_name="gpu-smoke-n1",
                                             pod_uid=pulumi.Output.from_input("uid-1"), node="n1", driver=DRIVER,
                                             extended_resource=ER, **common),
        kube_providers.OperatorReadiness("ready", node="n1", stage="dra", namespace="gpu-operator", **common),
    ]
    drain_ = kube_providers.NodeDrain("drain", node="n1", pilot_label=PILOT, extended_resource=ER, **common)
    declared += [drain_, kube_providers.RollbackVerification(
        "rollback", node="n1", rolling_back=drain_.rolling_back, extended_resource=ER, image="cuda", namespace=NS,
        **common)]
    expected = {"pre": "_DraPreflightProvider", "smoke": "_SmokeTestVerificationProvider",
                "ready": "_OperatorReadinessProvider", "drain": "_NodeDrainProvider",
                "rollback": "_RollbackVerificationProvider"}

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

    return pulumi.Output.all(drain_.rolling_back, declared[1].gpu_uuid, declared[-1].result).apply(check)


test_resources_declare_and_providers_serialize = pulumi.runtime.test(test_resources_declare_and_providers_serialize)
