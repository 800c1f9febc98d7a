"""The kube checks and dynamic providers, driving the real kubernetes client against the real API server
(tests/envtest.py). Node names, namespaces and DeviceClasses carry the test's prefix (`kube.name`, `kube.ns`): the
server is shared by the session."""
import base64
import json

import dill
import pulumi
import pytest
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException


from iks_gpu_migration.kube.records import VERIFICATION_ANNOTATION
from iks_gpu_migration.kube.provider import CheckFailed
from tests.envtest import eventually
from iks_gpu_migration.common.waiting import Interrupted
from iks_gpu_migration.kube.cluster import KUBELET_PLUGIN_CONTAINER
from iks_gpu_migration.kube.cordon import CORDON_ANNOTATION
from iks_gpu_migration.kube.fence import _NodeFenceProvider
from iks_gpu_migration.kube.inventory import GpuNodeInventory, _GpuNodeInventoryProvider
from iks_gpu_migration.kube.operands import OperandPlacement, _OperandPlacementProvider
from iks_gpu_migration.kube.preflight import DraPreflight, PROBE_CLASS, _DraPreflightProvider
from iks_gpu_migration.kube.readiness import _OperatorReadinessProvider, operator_ready
from iks_gpu_migration.kube.records import CONFIG_NAME_ANNOTATION
from iks_gpu_migration.kube.rollback import NodeDrain, ROLLBACK_NODE_LABEL, _NodeDrainProvider, _RollbackVerificationProvider
from iks_gpu_migration.kube.smoke import SmokeTestVerification, _SmokeTestVerificationProvider
from iks_gpu_migration.kube.smoke_criteria import verify_smoke
from iks_gpu_migration.kube.switch import NodePathSwitch, Readiness, RollbackCheck, _NodePathSwitchProvider
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


@pytest.fixture
def n1(kube):
    return kube.name("n1")


@pytest.fixture
def n2(kube):
    return kube.name("n2")


@pytest.fixture
def ns(kube):
    """The smoke and rollback checks' namespace (NS, prefixed)."""
    return kube.ns(NS)


def create(provider, kubeconfig, **props):
    return provider.create({"kubeconfig": kubeconfig, **props}).outs


# --- preflight ---------------------------------------------------------------------------------------------------


@pytest.fixture
def dra_cluster(kube, n1, n2):
    """n1 is dra (slices, no device plugin), n2 is device-plugin."""
    kube.add_node(n1, labels={"migration.example.com/gpu-dra": "pilot"})
    kube.add_node(n2, allocatable={"nvidia.com/gpu": "1"})
    kube.add_slice(n1, DRIVER, {"gpu-0": UUID0})
    return kube


def preflight(api, kube, dra_nodes=("n1",)):
    return kube_preflight.preflight(api, DRIVER, ER, [kube.name(n) for n in dra_nodes], [kube.name("n1"),
                                                                                      kube.name("n2")])


def test_preflight_waits_for_slices_then_passes(kube, kubeconfig, n1, n2, monkeypatch):
    from kubernetes import client
    kube.add_node(n1)
    kube.add_node(n2, allocatable={"nvidia.com/gpu": "1"})
    requests = kube.record(monkeypatch)
    kube.after_calls(monkeypatch, client.ResourceV1Api, "list_resource_slice", 2,
                     lambda: kube.add_slice(n1, DRIVER, {"gpu-0": UUID0}))
    outs = create(_DraPreflightProvider(), kubeconfig, driver=DRIVER, extended_resource=ER,
                  dra_nodes=[n1], all_nodes=[n1, n2], **FAST)
    assert outs["checked_nodes"] == [n1]
    assert sum(1 for _, p in requests if "resourceslices" in p) == 3  # it polled until the slice appeared


def test_preflight_fails_when_the_api_server_drops_extended_resource_name(dra_cluster, api, monkeypatch):
    # The OpenAPI schema lists the field, yet a server with the DRAExtendedResource gate off drops it (kubernetes
    # pkg/registry/resource/deviceclass/strategy.go): only the dry-run tells. A 1.37 server (gate GA, locked on)
    # can't be made to drop it, so its answer to the real dry-run create loses the field on the way back.
    from kubernetes import client
    real = client.ResourceV1Api.create_device_class
    calls = []

    def gate_off(self, body, **kwargs):
        calls.append(kwargs)
        created = real(self, body, **kwargs)
        created.spec.extended_resource_name = None
        return created

    monkeypatch.setattr(client.ResourceV1Api, "create_device_class", gate_off)
    requests = dra_cluster.record(monkeypatch)
    assert preflight(api, dra_cluster) == [
        "API server dropped DeviceClass spec.extendedResourceName on a dry-run create (sent 'example.com/gpu', "
        "read back None): DRA extended resources (feature gate DRAExtendedResource, GA in 1.37) are not enabled"]
    assert calls == [{"dry_run": "All"}]
    assert ("POST", "/apis/resource.k8s.io/v1/deviceclasses?dryRun=All") in requests
    # dry run: nothing stored
    assert PROBE_CLASS not in [c.metadata.name for c in client.ResourceV1Api(api).list_device_class().items]


def test_preflight_refuses_a_second_device_class_for_the_extended_resource(dra_cluster, api, n1, n2):
    own, chart, mig = dra_cluster.name("example.com-gpu"), dra_cluster.name("gpu.nvidia.com"), \
        dra_cluster.name("mig.nvidia.com")
    dra_cluster.add_device_class(own, ER)
    dra_cluster.add_device_class(chart, ER)  # e.g. the chart's class (25.12+ maps nvidia.com/gpu)
    dra_cluster.add_device_class(mig, None)
    problems = kube_preflight.preflight(api, DRIVER, ER, [n1], [n1, n2], device_class=own)
    assert problems == [f"DeviceClass {chart} also maps extended resource example.com/gpu (the later-created "
                        f"class wins); delete it, or let {own} be the only one"]


def test_preflight_fails_listing_dra_node_without_slices(dra_cluster, kubeconfig, n1, n2):
    with pytest.raises(CheckFailed) as e:
        create(_DraPreflightProvider(), kubeconfig, driver=DRIVER, extended_resource=ER,
               dra_nodes=[n1, n2], all_nodes=[n1, n2], **SHORT)
    assert f"node {n2}: no ResourceSlice devices of driver gpu.example.com (stage dra)" in str(e.value)
    assert f"node {n1}:" not in str(e.value)


def test_preflight_fails_on_slices_of_a_non_dra_node(dra_cluster, api, n2):
    dra_cluster.set_allocatable(n2, {"nvidia.com/gpu": None})
    dra_cluster.add_slice(n2, DRIVER, {"gpu-0": UUID1})
    assert preflight(api, dra_cluster) == [
        f"node {n2}: publishes 1 DRA devices of driver gpu.example.com but is not a dra node"]


def test_preflight_fails_on_gpus_offered_by_both_paths(dra_cluster, api, n1):
    dra_cluster.set_allocatable(n1, {ER: "2"})
    assert preflight(api, dra_cluster) == [
        f"node {n1}: GPUs offered twice: device plugin allocatable {{'example.com/gpu': 2}} "
        "and 1 DRA devices of driver gpu.example.com"
    ]


def test_preflight_passes_on_a_consistent_cluster(dra_cluster, api):
    # The real server stores extendedResourceName (the dry-run probe passes), n1 alone publishes, n2 has the plugin.
    assert preflight(api, dra_cluster) == []
    assert preflight(api, dra_cluster, dra_nodes=()) != []  # n1's slices are then unexpected


# --- smoke-test verification -------------------------------------------------------------------------------------

CLAIM = "gpu-smoke-test-n1-extended-resources-x7k2p"
SMOKE_LOG = f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {UUID0})\n{UUID0}, NVIDIA A100-SXM4-40GB\n"
CLAIM_STATUS = {"resourceClaimName": CLAIM, "requestMappings": [
    {"containerName": "main", "resourceName": ER, "requestName": "container-0-request-0"}]}


@pytest.fixture
def claim(dra_cluster, ns, n1):
    """DRA allocated gpu-0 (UUID0) of n1 to the smoke pod's extended-resource claim."""
    return dra_cluster.add_claim(ns, CLAIM, [{"driver": DRIVER, "pool": n1, "device": "gpu-0",
                                              "request": "container-0-request-0"}])


def smoke_pod(kube, ns, node, phase="Succeeded", exit_code=0, log=SMOKE_LOG, claim_status=True, **status):
    """The smoke pod as the kubelet reports it; by default it passed: logged UUID0 and exited 0."""
    if claim_status:
        status["extendedResourceClaimStatus"] = CLAIM_STATUS
    return kube.add_pod(ns, "gpu-smoke-test-n1", node=node, phase=phase, exit_code=exit_code, requests={ER: "1"},
                        log=log, **status)


@pytest.fixture
def smoke(claim, kube, ns, n1):
    """A passing smoke test on n1: DRA allocated gpu-0 (UUID0), the pod logged UUID0 and exited 0."""
    return smoke_pod(kube, ns, n1)


def verify(api, kube, dra_namespace=None):
    return verify_smoke(api, kube.name(NS), "gpu-smoke-test-n1", kube.name("n1"), DRIVER, ER, dra_namespace)


@pytest.mark.parametrize("line", [
    # NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/driver.go, v25.8.1 and v25.12.0
    "I1202 12:00:01.000000       1 driver.go:162] Returning newly prepared devices for claim '{uid}': [...]",
    "I1202 12:00:01.000000       1 driver.go:370] Returning newly prepared devices for claim "
    "'{ns}/gpu-smoke-test-n1-extended-resources-x7k2p:{uid}': [...]",
])
def test_smoke_criterion_2_needs_the_kubelet_plugin_log_line(smoke, claim, kube, api, line, ns, n1):
    claim_uid = claim["metadata"]["uid"]
    dra = kube.ns("dra")
    assert verify(api, kube, dra).problems == [
        f"criterion 2 (allocation): no DRA kubelet plugin pod on node {n1} in namespace {dra}"]
    plugin = "nvidia-dra-driver-gpu-kubelet-plugin-abcde"
    kube.add_pod(dra, plugin, node=n1, container=KUBELET_PLUGIN_CONTAINER,
                 log="Returning newly prepared devices for claim 'some-other-uid': []\n")
    assert verify(api, kube, dra).problems == [
        f"criterion 2 (allocation): DRA kubelet plugin {dra}/{plugin} logged no "
        f"prepared devices for claim {ns}/{CLAIM} (uid {claim_uid})"]
    kube.append_log(dra, plugin, line.format(uid=claim_uid, ns=ns), container=KUBELET_PLUGIN_CONTAINER)
    assert verify(api, kube, dra).problems == []


def verification(kubeconfig, kube, pod, **timing):
    return create(_SmokeTestVerificationProvider(), kubeconfig, namespace=kube.name(NS),
                  pod_name="gpu-smoke-test-n1", pod_uid=pod["metadata"]["uid"], node=kube.name("n1"), driver=DRIVER,
                  extended_resource=ER, **(timing or FAST))


def annotation(kube, node="n1"):
    return json.loads(kube.annotations(kube.name(node))[VERIFICATION_ANNOTATION])


def test_smoke_verification_waits_for_the_pod_and_passes(claim, kube, kubeconfig, ns, n1, monkeypatch):
    from kubernetes import client
    pod = smoke_pod(kube, ns, n1, phase="Running", exit_code=None)
    # The pod ends while the verification polls it (after its second look).
    kube.after_calls(monkeypatch, client.CoreV1Api, "read_namespaced_pod", 2, lambda: kube.set_pod_status(
        ns, "gpu-smoke-test-n1", {"phase": "Succeeded", "extendedResourceClaimStatus": CLAIM_STATUS,
                             "containerStatuses": [kube.container_status(ready=False, exit_code=0)]}))
    outs = verification(kubeconfig, kube, pod)
    assert (outs["gpu_uuid"], outs["device"], outs["claim"]) == (UUID0, f"gpu.example.com/{n1}/gpu-0", f"{ns}/{CLAIM}")
    assert outs["result"].startswith("passed:")
    assert annotation(kube) | {"checkedAt": None} == {
        "path": "dra", "result": "passed", "pod": f"{ns}/gpu-smoke-test-n1", "gpu": UUID0,
        "device": f"gpu.example.com/{n1}/gpu-0", "problems": [], "checkedAt": None, "podUid": pod["metadata"]["uid"]}


def test_smoke_criterion_1_wrong_node(claim, kube, api, ns, n2):
    smoke_pod(kube, ns, n2)
    assert verify(api, kube).problems == [
        f"criterion 1 (scheduling): pod {ns}/gpu-smoke-test-n1 is on node '{n2}', expected '{kube.name('n1')}'"]


def test_smoke_criterion_1_scheduling_error(smoke, kube, api, ns):
    kube.add_event(smoke, "FailedScheduling", "0/2 nodes are available: 1 Insufficient example.com/gpu")
    kube.add_event(smoke, "Scheduled", "Successfully assigned", type_="Normal")
    assert verify(api, kube).problems == [f"criterion 1 (scheduling): pod {ns}/gpu-smoke-test-n1 event FailedScheduling: "
                                          "0/2 nodes are available: 1 Insufficient example.com/gpu"]


def test_smoke_unschedulable_pod_fails_without_waiting_for_timeout(claim, kube, kubeconfig, ns):
    pod = kube.add_pod(ns, "gpu-smoke-test-n1", phase="Pending", requests={ER: "1"}, conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}])
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, kube, pod, timeout=30, poll_interval=0.02)
    assert f"criterion 1 (scheduling): pod {ns}/gpu-smoke-test-n1 PodScheduled=False Unschedulable: no GPU" in str(
        e.value)
    assert annotation(kube)["result"] == "failed"


def test_smoke_criterion_2_no_allocation_recorded(claim, kube, api, ns, n1):
    smoke_pod(kube, ns, n1, claim_status=False)
    assert verify(api, kube).problems == [
        f"criterion 2 (allocation): pod {ns}/gpu-smoke-test-n1 has no status.extendedResourceClaimStatus "
        "(example.com/gpu was not allocated through DRA)"]


def test_smoke_criterion_2_claim_without_device_of_the_driver(smoke, kube, api, ns):
    kube.set_claim_allocation(ns, CLAIM, None)
    assert verify(api, kube).problems == [
        f"criterion 2 (allocation): ResourceClaim {ns}/{CLAIM} has no device of driver gpu.example.com "
        "for requests ['container-0-request-0']; allocation: no devices"]


def test_smoke_criterion_3_uuid_mismatch(smoke, kube, api, ns, n1):
    kube.set_log(ns, "gpu-smoke-test-n1", f"GPU 0: NVIDIA A100 (UUID: {UUID1})\n")
    assert verify(api, kube).problems == [
        f"criterion 3 (GPU in logs): pod {ns}/gpu-smoke-test-n1 logs name ['{UUID1}'], "
        f"allocated device gpu.example.com/{n1}/gpu-0 is {UUID0} (allocated uuid {UUID0} not printed)"]
    kube.set_log(ns, "gpu-smoke-test-n1", f"GPU 0: NVIDIA A100 (UUID: {UUID0})\nGPU 1: NVIDIA A100 (UUID: {UUID1})\n")
    assert verify(api, kube).problems == [
        f"criterion 3 (GPU in logs): pod {ns}/gpu-smoke-test-n1 logs name ['{UUID0}', '{UUID1}'], "
        f"allocated device gpu.example.com/{n1}/gpu-0 is {UUID0} (other GPU devices visible: ['{UUID1}'])"]


MIG0 = "MIG-9f8e7d6c-5b4a-3c2d-1e0f-a9b8c7d6e5f4"


def test_smoke_criterion_3_accepts_mig_output(smoke, kube, api, ns, n1):
    # A MIG device: nvidia-smi -L prints its parent GPU's line first, then the MIG line with the allocated uuid.
    [published] = kube.slices(n1)
    kube.set_slice_device_uuid(published["metadata"]["name"], "gpu-0", MIG0)
    kube.set_log(ns, "gpu-smoke-test-n1", f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUID1})\n"
                                     f"  MIG 1g.10gb     Device  0: (UUID: {MIG0})\n")
    result = verify(api, kube)
    assert result.problems == [] and result.gpu_uuid == MIG0


def test_smoke_criterion_3_no_gpu_in_logs(smoke, kube, api, ns):
    kube.set_log(ns, "gpu-smoke-test-n1", "No devices were found\n")
    assert verify(api, kube).problems == [
        f"criterion 3 (GPU in logs): pod {ns}/gpu-smoke-test-n1 logs name no GPU UUID; logs: 'No devices were found\\n'"]


def test_smoke_criterion_4_pod_failed(claim, kube, kubeconfig, ns, n1):
    pod = smoke_pod(kube, ns, n1, phase="Failed", exit_code=3)
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, kube, pod)
    assert str(e.value).startswith(
        f"smoke test {ns}/gpu-smoke-test-n1 on node {n1} failed:\n  - criterion 4 (GPU operation): "
        f"pod {ns}/gpu-smoke-test-n1 phase Failed, containers: ['main exit 3 (Error)']\nnode {n1} stays cordoned. "
        "Fix the cause and run `pulumi up` again: it replaces the pod")
    assert annotation(kube)["problems"] == [str(e.value).split("  - ")[1].split("\n")[0]]


def test_smoke_image_pull_failure_is_reported_at_once(claim, kube, kubeconfig, ns, n1):
    pod = kube.add_pod(ns, "gpu-smoke-test-n1", node=n1, phase="Pending", requests={ER: "1"})
    kube.set_pod_status(ns, "gpu-smoke-test-n1", {"phase": "Pending", "containerStatuses": [kube.container_status(
        waiting="ImagePullBackOff", message="Back-off pulling image \"cuda:nope\"")]})
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, kube, pod, timeout=30, poll_interval=0.02)  # fails long before the timeout
    assert (f'criterion 4 (GPU operation): pod {ns}/gpu-smoke-test-n1 container main ImagePullBackOff: Back-off '
            'pulling image "cuda:nope"') in str(e.value)


def passing_run(kube, ns, node, created):
    """What the scheduler and kubelet do with a re-created smoke pod: it runs on `node` and passes."""
    def run(pod):
        created.append(pod)
        name = pod["metadata"]["name"]
        if not pod["spec"].get("nodeName"):
            kube.bind(ns, name, node)
        kube.set_log(ns, name, SMOKE_LOG, container=pod["spec"]["containers"][0]["name"])
        kube.set_pod_status(ns, name, {"phase": "Succeeded", "extendedResourceClaimStatus": CLAIM_STATUS,
                                       "containerStatuses": [kube.container_status(ready=False, exit_code=0)]})
    return run


def test_failed_smoke_test_is_rerun_with_a_fresh_pod_by_the_next_up(claim, kube, kubeconfig, ns, n1):
    smoke = smoke_pod(kube, ns, n1, phase="Failed")
    with pytest.raises(CheckFailed):
        verification(kubeconfig, kube, smoke)
    created = []
    kube.on_pod_create(ns, passing_run(kube, ns, n1, created))  # the re-created pod is scheduled again and passes
    outs = verification(kubeconfig, kube, smoke)  # same Pod resource (same uid in state): the next `up`
    assert outs["result"].startswith("passed:") and len(created) == 1
    current = kube.pod(ns, "gpu-smoke-test-n1")["metadata"]["uid"]
    assert current != smoke["metadata"]["uid"] and current == created[0]["metadata"]["uid"]
    assert annotation(kube)["podUid"] == current
    # Passed: a later verification of the same (re-created) pod judges it again instead of replacing it.
    assert verification(kubeconfig, kube, smoke)["result"].startswith("passed:") and len(created) == 1


def test_a_re_created_smoke_pod_that_fails_again_is_replaced_again(claim, kube, kubeconfig, ns, n1, monkeypatch):
    smoke = smoke_pod(kube, ns, n1, phase="Failed")
    kube.on_pod_create(ns, lambda pod: kube.set_pod_status(ns, pod["metadata"]["name"], {"phase": "Failed"}))
    requests = kube.record(monkeypatch)
    for expected_pods in (0, 1, 2):  # three `up`s, the Pod resource (and its uid in state) unchanged
        with pytest.raises(CheckFailed):
            verification(kubeconfig, kube, smoke)
        assert requests.count(("POST", f"/api/v1/namespaces/{ns}/pods")) == expected_pods


def test_a_smoke_pod_that_ended_unwatched_and_lost_its_claim_is_run_again(dra_cluster, kube, kubeconfig, ns, n1):
    """E.g. the pod of a killed `up`, adopted by `recover`: it finished while nothing watched it and the resourceclaim
    controller deleted its claim, so criterion 2 can't be judged on it. The next `up` runs it again and passes."""
    smoke = smoke_pod(kube, ns, n1)  # Succeeded, its claim gone
    created = []
    run = passing_run(kube, ns, n1, created)

    def scheduled(pod):  # DRA allocates a claim for the new pod, then it runs and passes
        dra_cluster.add_claim(ns, CLAIM, [{"driver": DRIVER, "pool": n1, "device": "gpu-0",
                                           "request": "container-0-request-0"}])
        run(pod)
    kube.on_pod_create(ns, scheduled)
    outs = verification(kubeconfig, kube, smoke)
    assert outs["result"].startswith("passed:") and len(created) == 1
    assert annotation(kube)["podUid"] == created[0]["metadata"]["uid"] != smoke["metadata"]["uid"]


def test_smoke_criterion_2_deleted_claim_suggests_a_longer_command_only_for_a_watched_pod(kube, api, ns, n1):
    smoke_pod(kube, ns, n1)  # its claim is gone
    deleted = (f"criterion 2 (allocation): ResourceClaim {ns}/{CLAIM} was deleted before it could be read (the "
               f"resourceclaim controller removes a finished pod's claim)")
    assert verify(api, kube).problems[0] == (
        f"{deleted}; the pod had ended before it was judged: run `pulumi up` again, it runs the pod again")
    watched = verify_smoke(api, kube.name(NS), "gpu-smoke-test-n1", kube.name("n1"), DRIVER, ER, claims={})
    assert watched.problems[0] == (
        f"{deleted}; the pod ended between two readings: make gpu-migration:smokeTest.command hold the GPU longer "
        f"than timeouts.pollInterval, e.g. end it with `&& sleep 60`")


def test_smoke_pass_with_a_failing_uncordon_says_what_to_do(smoke, kube, kubeconfig, monkeypatch, ns, n1):
    kube.cordon(n1, annotations={CORDON_ANNOTATION: "dra"})
    real = client.CoreV1Api.patch_node

    def refuse_uncordon(self, name, body, **kwargs):
        if "spec" in body:
            raise ApiException(status=403, reason="Forbidden")
        return real(self, name, body, **kwargs)

    monkeypatch.setattr(client.CoreV1Api, "patch_node", refuse_uncordon)
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, kube, smoke)
    message = str(e.value)
    assert message.startswith(f"smoke test passed: {ns}/gpu-smoke-test-n1 used ")
    assert f"but uncordoning node {n1} failed: HTTP 403 Forbidden" in message and f"kubectl uncordon {n1}" in message
    assert annotation(kube)["result"] == "passed"
    assert kube.unschedulable(n1) is True


def test_smoke_pass_uncordons_only_a_node_the_switch_cordoned(smoke, kube, kubeconfig, n1):
    kube.cordon(n1, annotations={CORDON_ANNOTATION: "dra"})
    outs = verification(kubeconfig, kube, smoke)
    assert outs["result"] == f"passed: {outs['gpu_uuid']} ({outs['device']}); uncordoned"
    assert len(outs["result"]) <= 150  # the CLI cuts longer lines of an output
    assert kube.unschedulable(n1) is False
    kube.cordon(n1)  # an admin's cordon: left alone
    assert not verification(kubeconfig, kube, smoke)["result"].endswith("uncordoned")
    assert kube.unschedulable(n1) is True


def failing_patch_node(monkeypatch):
    """The API server refuses the annotation patch (e.g. RBAC without patch on nodes)."""
    def refuse(self, name, body, **kwargs):
        raise ApiException(status=403, reason="Forbidden")
    monkeypatch.setattr(client.CoreV1Api, "patch_node", refuse)


def test_failing_to_record_does_not_hide_the_smoke_failure(claim, kube, kubeconfig, monkeypatch, ns, n1):
    smoke = smoke_pod(kube, ns, n1, phase="Failed")
    failing_patch_node(monkeypatch)
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, kube, smoke)
    message = str(e.value)
    assert message.startswith(f"smoke test {ns}/gpu-smoke-test-n1 on node {n1} failed:\n  - criterion 4")
    assert f"the result could not be recorded on node {n1}" in message and "HTTP 403 Forbidden" in message
    # Without the record the next `up` can't tell this pod failed: the message says how to re-run instead.
    assert "replace the pod yourself: `pulumi up --replace <URN of smoke-n1>`" in message
    assert "it replaces the pod" not in message
    assert VERIFICATION_ANNOTATION not in kube.annotations(n1)


def test_smoke_verification_waits_for_the_expected_pod_uid(smoke, kube, kubeconfig, ns):
    with pytest.raises(CheckFailed) as e:
        verification(kubeconfig, kube, {"metadata": {"uid": "other-uid"}}, **SHORT)
    assert f"pod {ns}/gpu-smoke-test-n1 to finish" in str(e.value) and "expected other-uid" in str(e.value)


def test_smoke_verification_reruns_only_when_the_pod_changes():
    provider = _SmokeTestVerificationProvider()
    olds = {"pod_uid": "a", "node": "n1", "timeout": 600, "result": "passed"}
    assert provider.diff("id", olds, {"pod_uid": "b", "node": "n1", "timeout": 600}).replaces == ["pod_uid"]
    timeout_only = provider.diff("id", olds, {"pod_uid": "a", "node": "n1", "timeout": 60})
    assert (timeout_only.changes, timeout_only.replaces) == (True, [])
    assert not provider.diff("id", olds, {"pod_uid": "a", "node": "n1", "timeout": 600}).changes




# --- operator readiness ------------------------------------------------------------------------------------------


@pytest.fixture
def operator(dra_cluster, n1, n2):
    gpu_operator = dra_cluster.ns("gpu-operator")
    for short, node in (("n1", n1), ("n2", n2)):
        dra_cluster.add_pod(gpu_operator, f"nvidia-driver-daemonset-{short}", node=node)
        dra_cluster.add_pod(gpu_operator, f"nvidia-container-toolkit-daemonset-{short}", node=node)
        dra_cluster.add_pod(gpu_operator, f"nvidia-cuda-validator-{short}", node=node, phase="Succeeded", exit_code=0)
    return dra_cluster


def test_operator_ready_on_both_paths(operator, api, n1, n2):
    gpu_operator = operator.ns("gpu-operator")
    assert operator_ready(api, n2, gpu_operator, "device-plugin") == []
    assert operator_ready(api, n1, gpu_operator, "dra", DRIVER) == []


def test_operator_not_ready_lists_pods_and_gpus(operator, api, n1, n2):
    gpu_operator = operator.ns("gpu-operator")
    operator.add_pod(gpu_operator, "nvidia-device-plugin-daemonset-n2", node=n2, waiting="CrashLoopBackOff")
    operator.set_allocatable(n2, {"nvidia.com/gpu": "0"})
    assert operator_ready(api, n2, gpu_operator, "device-plugin") == [
        f"node {n2}: pod {gpu_operator}/nvidia-device-plugin-daemonset-n2 is Running (main: CrashLoopBackOff)",
        f"node {n2}: nvidia.com/gpu allocatable is 0 (device plugin not serving)"]
    operator.delete_slices()
    assert operator_ready(api, n1, gpu_operator, "dra", DRIVER) == [
        f"node {n1}: no DRA devices in ResourceSlices of driver gpu.example.com"]
    n3 = operator.name("n3")
    assert operator_ready(api, n3, gpu_operator, "dra")[0] == (
        f"node {n3}: no nvidia-driver-daemonset pod in namespace {gpu_operator}")


def test_dra_readiness_checks_named_operands_not_the_looping_validator(operator, api, n1):
    # The validator's plugin-validation init container waits for nvidia.com/gpu capacity, which a dra node never
    # gets: it loops there. It must not block readiness; the DRA kubelet plugin pod must be Ready.
    gpu_operator, dra = operator.ns("gpu-operator"), operator.ns("dra")
    operator.add_pod(gpu_operator, "nvidia-operator-validator-n1", node=n1, phase="Pending", waiting="PodInitializing")
    assert operator_ready(api, n1, gpu_operator, "dra", DRIVER, dra_namespace=dra) == [
        f"node {n1}: no DRA kubelet plugin pod in namespace {dra}"]
    plugin = "nvidia-dra-driver-gpu-kubelet-plugin-x1"
    operator.add_pod(dra, plugin, node=n1, ready=False, waiting="ContainerCreating")
    assert operator_ready(api, n1, gpu_operator, "dra", DRIVER, dra_namespace=dra) == [
        f"node {n1}: pod {dra}/{plugin} is Running (main: ContainerCreating)"]
    operator.update_pod_status(dra, plugin, containerStatuses=[operator.container_status(ready=True)],
                               conditions=[{"type": "Ready", "status": "True"}])
    operator.update_pod_status(gpu_operator, "nvidia-container-toolkit-daemonset-n1", phase="Pending")
    assert operator_ready(api, n1, gpu_operator, "dra", DRIVER, dra_namespace=dra) == [
        f"node {n1}: pod {gpu_operator}/nvidia-container-toolkit-daemonset-n1 is Pending"]


def test_operator_ready_checks_the_device_plugin_resource_name(operator, api, n2):
    gpu_operator = operator.ns("gpu-operator")
    assert operator_ready(api, n2, gpu_operator, "device-plugin", resource="example.com/gpu") == [
        f"node {n2}: example.com/gpu allocatable is 0 (device plugin not serving)"]
    operator.set_allocatable(n2, {"example.com/gpu": "2"})
    assert operator_ready(api, n2, gpu_operator, "device-plugin", resource="example.com/gpu") == []


def test_preflight_sees_double_offering_under_the_device_plugin_resource_name(dra_cluster, api, n1, n2):
    dra_cluster.set_allocatable(n1, {"vendor.example/gpu": "1"})
    assert kube_preflight.preflight(api, DRIVER, ER, [n1], [n1, n2]) == []
    problems = kube_preflight.preflight(api, DRIVER, ER, [n1], [n1, n2], device_plugin_resource="vendor.example/gpu")
    assert problems and "GPUs offered twice" in problems[0] and "vendor.example/gpu" in problems[0]


def test_operator_readiness_provider_waits_then_fails_with_problems(operator, kube, kubeconfig, n1, n2, monkeypatch):
    from kubernetes import client
    gpu_operator = operator.ns("gpu-operator")
    provider = _OperatorReadinessProvider()
    operator.update_pod_status(gpu_operator, "nvidia-driver-daemonset-n2", phase="Pending")
    with monkeypatch.context() as m:  # the driver pod comes up while the check polls (after its second look)
        polls = kube.after_calls(m, client.CoreV1Api, "list_namespaced_pod", 2, lambda: operator.update_pod_status(
            gpu_operator, "nvidia-driver-daemonset-n2", phase="Running"))
        assert create(provider, kubeconfig, node=n2, stage="device-plugin", namespace=gpu_operator, **FAST)["ready"]
        assert len(polls) > 2  # it did wait for the pod
    with pytest.raises(CheckFailed) as e:
        create(provider, kubeconfig, node=n1, stage="device-plugin", namespace=gpu_operator, **SHORT)
    assert str(e.value) == (f"GPU Operator on node {n1} (device-plugin) did not pass within 0s:\n"
                            f"  - node {n1}: nvidia.com/gpu allocatable is 0 (device plugin not serving)")


# --- rollback: drain, labels (lead's NodePatch), verification ------------------------------------------------------


def drain(kubeconfig, kube, **timing):
    return create(_NodeDrainProvider(), kubeconfig, node=kube.name("n1"), pilot_label=PILOT,
                  extended_resource=ER, **(timing or FAST))


def test_drain_is_a_no_op_without_the_pilot_label(kube, kubeconfig, n1, monkeypatch):
    kube.add_node(n1)
    requests = kube.record(monkeypatch)
    assert drain(kubeconfig, kube)["rolling_back"] is False
    assert kube.unschedulable(n1) is False
    assert [m for m, _ in requests] == ["GET"]


def test_drain_cordons_and_waits_for_gpu_pods(dra_cluster, kube, kubeconfig, n1, monkeypatch):
    ml = kube.ns("ml")
    kube.add_pod(ml, "training", node=n1, requests={ER: "1"})
    kube.add_pod(kube.ns("kube-system"), "dns", node=n1)  # no GPU: not waited for
    kube.add_pod(ml, "done", node=n1, phase="Succeeded", exit_code=0, requests={ER: "1"})
    polls = kube.after_calls(monkeypatch, cluster, "gpu_pods", 2,
                             lambda: kube.update_pod_status(ml, "training", phase="Succeeded"))
    assert drain(kubeconfig, kube)["rolling_back"] is True
    assert kube.unschedulable(n1) is True
    assert kube.pod(ml, "training")["status"]["phase"] == "Succeeded" and len(polls) == 3


def test_drain_waits_for_pods_with_resource_claims_and_times_out_naming_them(dra_cluster, kube, kubeconfig, n1):
    ml = kube.ns("ml")
    kube.add_pod(ml, "training", node=n1, requests={ER: "1"})
    kube.add_pod(ml, "inference", node=n1, resource_claims=[{"name": "gpu", "resourceClaimName": "inference-gpu"}])
    with pytest.raises(CheckFailed) as e:
        drain(kubeconfig, kube, **SHORT)
    assert f"waiting for GPU pods on node {n1} to finish" in str(e.value)
    assert f"GPU pods still running: {ml}/inference, {ml}/training" in str(e.value)
    assert f"node {n1} is left cordoned" in str(e.value)
    assert kube.unschedulable(n1) is True


def test_api_error_during_the_drain_wait_still_says_the_node_is_left_cordoned(dra_cluster, kube, kubeconfig,
                                                                              monkeypatch, n1):
    kube.add_pod(kube.ns("ml"), "training", node=n1, requests={ER: "1"})
    calls = []
    real = cluster.gpu_pods

    def flaky(*args):
        calls.append(args)
        if len(calls) > 1:
            raise ApiException(status=500, reason="Internal Server Error")
        return real(*args)

    monkeypatch.setattr(cluster, "gpu_pods", flaky)
    with pytest.raises(CheckFailed) as e:
        drain(kubeconfig, kube)
    message = str(e.value)
    assert f"reading the GPU pods on node {n1} failed while waiting for them to finish: HTTP 500" in message
    assert f"node {n1} is left cordoned with its labels unchanged; run `pulumi up` again to continue" in message
    assert kube.unschedulable(n1) is True


def rollback(kubeconfig, kube, rolling_back=True, **timing):
    return create(_RollbackVerificationProvider(), kubeconfig, node=kube.name("n1"),
                  rolling_back=rolling_back, extended_resource=ER, image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                  namespace=kube.name(NS), **(timing or FAST))


# --- fence for nodes still on IBM-managed drivers ------------------------------------------------------------------

FENCE = {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}


def fence(kubeconfig, node):
    return create(_NodeFenceProvider(), kubeconfig, node=node, labels=FENCE,
                  operator_min_version="1.36")


def test_fence_labels_only_nodes_on_ibm_kubelets(kube, kubeconfig):
    old, new = kube.name("old"), kube.name("new")
    kube.add_node(old, kubelet_version="v1.35.4+IKS")
    kube.add_node(new, kubelet_version="v1.36.1+IKS")
    assert fence(kubeconfig, old)["fenced"] is True
    assert {k: kube.labels(old).get(k) for k in FENCE} == FENCE
    assert fence(kubeconfig, new)["fenced"] is False
    assert not FENCE.keys() & kube.labels(new).keys()
    assert fence(kubeconfig, kube.name("gone"))["fenced"] is False  # already replaced under another name


def test_fence_of_an_ibm_managed_node_refuses_a_replaced_or_missing_node(kube, kubeconfig):
    import re
    old, new, typo = kube.name("old"), kube.name("new"), kube.name("typo")
    kube.add_node(old, kubelet_version="v1.35.4+IKS")
    kube.add_node(new, kubelet_version="v1.37.0+IKS")
    ibm = dict(labels=FENCE, operator_min_version="1.36", stage="ibm-managed")
    assert create(_NodeFenceProvider(), kubeconfig, node=old, **ibm)["fenced"] is True
    with pytest.raises(CheckFailed, match=re.escape(f"node {new} is set to stage ibm-managed but runs kubelet v1.37.0")):
        create(_NodeFenceProvider(), kubeconfig, node=new, **ibm)
    assert "nvidia.com/gpu.deploy.operands" not in kube.labels(new)  # untouched
    with pytest.raises(CheckFailed, match=re.escape(f"node {typo} (stage ibm-managed in gpu-migration:nodes) matches "
                                                    "no node")):
        create(_NodeFenceProvider(), kubeconfig, node=typo, **ibm)


# --- GPU node inventory, operand placement, pending GPU pods ---------------------------------------------------------

IKS_GPU = {"ibm-cloud.kubernetes.io/machine-type": "gx3.16x80.l4"}


def inventory(api, configured, worker_ids=None, temp_pool=None, seen=None):
    found = kube_inventory.inventory(api, configured, worker_ids or {}, "1.36", temp_pool, seen)
    return found.problems, found.warnings


POOL_A = {"ibm-cloud.kubernetes.io/worker-pool-name": "gpu", "ibm-cloud.kubernetes.io/zone": "us-south-1"}


def test_inventory_names_unlisted_gpu_nodes_and_missing_config_names(kube, api):
    a, b, gone, typo = (kube.name(n) for n in ("a", "b", "gone", "typo"))
    kube.add_node(a, allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")
    kube.add_node(b, labels=IKS_GPU, kubelet_version="v1.35.4+IKS")  # GPU flavor, no driver yet
    kube.add_node(kube.name("cpu"), labels={"ibm-cloud.kubernetes.io/machine-type": "bx2.4x16"})
    problems, warnings = inventory(api, {a: "ibm-managed", gone: "ibm-managed", typo: "device-plugin"})
    assert problems == [
        f"GPU node {b} (kubelet v1.35.4+IKS, flavor gx3.16x80.l4, worker pool ?, zone ?) is not listed in "
        "gpu-migration:nodes: it runs IBM-managed drivers and would get the GPU Operator next to them; add it with "
        f"stage ibm-managed ({{name: {b}, workerId: ?, stage: ...}})",
        f"node {gone} in gpu-migration:nodes (stage ibm-managed) matches no node in the cluster; fix its name "
        "(`kubectl get nodes`)",
        f"node {typo} in gpu-migration:nodes (stage device-plugin) matches no node in the cluster and no earlier run "
        "saw it; fix its name (`kubectl get nodes`)"]
    assert warnings == []


def test_an_unlisted_node_past_ibm_drivers_is_a_problem_unless_it_is_a_listed_nodes_new_worker(kube, api):
    n9, n1, n8 = kube.name("10.0.0.9"), kube.name("10.0.0.1"), kube.name("10.0.0.8")
    kube.add_node(n9, labels={**IKS_GPU, **POOL_A, "ibm-cloud.kubernetes.io/worker-id": "w-new"},
                  kubelet_version="v1.37.0+IKS")
    # No earlier run saw 10.0.0.1: a stray GPU node and a wrong name, both named.
    problems, warnings = inventory(api, {n1: "dra"})
    assert problems == [
        f"GPU node {n9} (kubelet v1.37.0+IKS, flavor gx3.16x80.l4, worker pool gpu, zone us-south-1) is not listed "
        "in gpu-migration:nodes, and it is not the new worker of a listed node whose replacement is under way (none "
        f"in that pool and zone); add it with its stage ({{name: {n9}, workerId: w-new, stage: ...}}), or remove "
        "it from the cluster",
        f"node {n1} in gpu-migration:nodes (stage dra) matches no node in the cluster and no earlier run saw it; "
        "fix its name (`kubectl get nodes`)"]
    # An earlier run saw 10.0.0.1 in another zone: still not its new worker.
    elsewhere = {n1: {"pool": "gpu", "zone": "us-south-2"}}
    assert len(inventory(api, {n1: "dra"}, seen=elsewhere)[0]) == 1
    # Same pool and zone: an interrupted replacement; both only warn, so `up` resumes it.
    there = {n1: {"pool": "gpu", "zone": "us-south-1"}}
    problems, warnings = inventory(api, {n1: "dra"}, seen=there)
    assert problems == [] and warnings == [
        f"GPU node {n9} (kubelet v1.37.0+IKS, flavor gx3.16x80.l4, worker pool gpu, zone us-south-1) is not listed "
        f"in gpu-migration:nodes; taken for the new worker of {n1} (same pool and zone, whose node is gone): the "
        f"resumed replacement of {n1} records it"]
    # One new worker explains one entry, not two.
    kube.add_node(n8, labels={**IKS_GPU, **POOL_A}, kubelet_version="v1.37.0+IKS")
    assert len(inventory(api, {n1: "dra"}, seen=there)[0]) == 1
    kube.delete_node(n8)
    # The node is gone and no new worker joined yet: the replacement is under way.
    kube.delete_node(n9)
    assert inventory(api, {n1: "dra"}, seen=there) == ([], [
        f"node {n1} in gpu-migration:nodes (stage dra) is gone since an earlier run saw it and no new worker has "
        "joined yet: its replacement resumes"])
    # An ibm-managed entry is never explained by a replacement: its node would stay unfenced.
    assert len(inventory(api, {n1: "ibm-managed"}, seen=there)[0]) == 1


def test_inventory_takes_new_workers_for_entries_as_the_resumed_replacements_pair_them(kube, api):
    """Entries by name, new workers by ID (iks/claims.py pair_new_workers), whatever the listing order."""
    n1, n2 = kube.name("10.0.0.1"), kube.name("10.0.0.2")
    n3, n4 = kube.name("10.0.0.3"), kube.name("10.0.0.4")
    kube.add_node(n3, labels={**IKS_GPU, **POOL_A, "ibm-cloud.kubernetes.io/worker-id": "w-b"},
                  kubelet_version="v1.37.0+IKS")
    kube.add_node(n4, labels={**IKS_GPU, **POOL_A, "ibm-cloud.kubernetes.io/worker-id": "w-a"},
                  kubelet_version="v1.37.0+IKS")
    there = {"pool": "gpu", "zone": "us-south-1"}
    problems, warnings = inventory(api, {n2: "dra", n1: "device-plugin"}, seen={n1: there, n2: there})
    assert problems == []
    assert [(w.split()[2], w.split("taken for the new worker of ")[1].split()[0]) for w in warnings] == [
        (n4, n1), (n3, n2)]


def test_inventory_ties_replaced_nodes_to_their_config_entry(kube, api):
    n9, n1 = kube.name("10.0.0.9"), kube.name("10.0.0.1")
    kube.add_node(n9, labels={**IKS_GPU, "ibm-cloud.kubernetes.io/worker-id": "w-new"}, kubelet_version="v1.37.0+IKS",
                  annotations={CONFIG_NAME_ANNOTATION: n1})
    assert inventory(api, {n1: "dra"}) == ([], [])
    # Its entry's workerId set to the new worker, and the node tied to it: fine.
    assert inventory(api, {n1: "dra"}, worker_ids={"w-new": n1}) == ([], [])
    # An entry whose own worker's node has another name: a wrong name, not a replacement.
    kube.patch_node(n9, {"metadata": {
        "annotations": {CONFIG_NAME_ANNOTATION: None},
        "labels": {"ibm-cloud.kubernetes.io/worker-pool-name": "tmp", "ibm-cloud.kubernetes.io/worker-id": "w-old"}}})
    assert inventory(api, {n1: "ibm-managed"}, worker_ids={"w-old": n1})[0] == [
        f"node {n1} in gpu-migration:nodes has workerId w-old, whose node is {n9}; set its name to {n9}"]
    # The temporary pool's GPU node is ours, listed or not.
    assert len(inventory(api, {})[0]) == 1
    assert inventory(api, {}, temp_pool="tmp") == ([], [])


def test_inventory_provider_fails_before_anything_is_installed(kube, kubeconfig):
    stray = kube.name("stray")
    kube.add_node(stray, allocatable={"nvidia.com/gpu": "2"}, kubelet_version="v1.35.4+IKS")
    with pytest.raises(CheckFailed, match=f"nothing was installed:\n  - GPU node {stray}"):
        create(_GpuNodeInventoryProvider(), kubeconfig, configured={}, worker_ids={},
               operator_min_version="1.36")


def test_operand_placement_names_node_and_pods(kube, kubeconfig):
    gpu_operator, ibm1, new1 = kube.ns("gpu-operator"), kube.name("ibm1"), kube.name("new1")
    kube.add_node(ibm1, kubelet_version="v1.35.4+IKS")  # IBM's drivers
    kube.add_node(new1, kubelet_version="v1.37.0+IKS")
    kube.add_pod(gpu_operator, "nvidia-driver-daemonset-x1", node=ibm1)
    kube.add_pod(gpu_operator, "nvidia-dcgm-exporter-x2", node=ibm1)
    kube.add_pod(gpu_operator, "gpu-feature-discovery-x3", node=ibm1)  # not one the runbook checks
    kube.add_pod(gpu_operator, "nvidia-driver-daemonset-x4", node=new1)
    with pytest.raises(CheckFailed) as e:
        create(_OperandPlacementProvider(), kubeconfig, namespace=gpu_operator, operator_min_version="1.36")
    assert (f"node {ibm1}: runs IBM-managed drivers (kubelet v1.35.4+IKS, below 1.36) but has GPU Operator pods "
            f"{gpu_operator}/nvidia-dcgm-exporter-x2, {gpu_operator}/nvidia-driver-daemonset-x1") in str(e.value)
    assert new1 not in str(e.value) and "gpu-feature-discovery" not in str(e.value)
    clean = kube.ns("gpu-operator-clean")
    kube.add_pod(clean, "nvidia-driver-daemonset-x5", node=new1)
    out = create(_OperandPlacementProvider(), kubeconfig, namespace=clean, operator_min_version="1.36")
    assert out["checked"] == "no operand on a node below 1.36"


def test_operand_placement_judges_each_node_by_its_kubelet_not_its_name(kube, kubeconfig):
    """A replaced node's name can come back (VPC hands the freed IP, the node name, to a later worker, which runs
    the GPU Operator by design); a pod bound to a node that is gone runs nowhere. The state holds no node names."""
    gpu_operator, n11, n13, gone = (kube.ns("gpu-operator"), kube.name("10.0.0.11"), kube.name("10.0.0.13"),
                                    kube.name("10.0.0.14"))
    kube.add_node(n11, kubelet_version="v1.37.0+IKS")  # a new worker that got the old IP
    kube.add_node(n13, kubelet_version="v1.35.4+IKS")  # still on IBM's drivers
    for node in (n11, n13, gone):
        kube.add_pod(gpu_operator, f"nvidia-driver-daemonset-{node}", node=node)
    with pytest.raises(CheckFailed) as e:
        create(_OperandPlacementProvider(), kubeconfig, namespace=gpu_operator, operator_min_version="1.36")
    assert f"node {n13}: runs IBM-managed drivers" in str(e.value)
    assert f"node {n11}" not in str(e.value) and gone not in str(e.value)


def test_readiness_then_pending_gpu_pods_reported_or_gated(operator, kube, kubeconfig, n2):
    """Once the node is ready, its readiness check lists the GPU pods still Pending (a warning), or stops `up` with
    pendingGpuPodsGate."""
    ml, gpu_operator = kube.ns("ml"), operator.ns("gpu-operator")
    kube.add_pod(ml, "train", phase="Pending", requests={"nvidia.com/gpu": "1"}, conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    kube.add_pod(kube.ns("web"), "frontend", phase="Pending")  # no GPU: not reported
    props = dict(node=n2, stage="device-plugin", namespace=gpu_operator, resources=["nvidia.com/gpu"], **FAST)
    outs = create(_OperatorReadinessProvider(), kubeconfig, gate=False, **props)
    assert outs["ready"] and outs["pending"] == [
        f"{ml}/train (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)"]
    with pytest.raises(CheckFailed, match=f"after node {n2}, GPU pods are still Pending"):
        create(_OperatorReadinessProvider(), kubeconfig, gate=True, **props)


def test_readiness_then_operand_placement(operator, kube, kubeconfig, n2):
    """Once the node is ready, its readiness check looks at every operand pod again: one on a node below the
    operator's minimum (IBM's drivers) stops `up`, naming node and pod."""
    gpu_operator, ibm = operator.ns("gpu-operator"), kube.name("ibm")
    kube.add_node(ibm, kubelet_version="v1.35.4+IKS")
    props = dict(node=n2, stage="device-plugin", namespace=gpu_operator, operator_min_version="1.36", **FAST)
    assert create(_OperatorReadinessProvider(), kubeconfig, **props)["ready"]
    kube.add_pod(gpu_operator, "nvidia-device-plugin-daemonset-x9", node=ibm)
    with pytest.raises(CheckFailed) as e:
        create(_OperatorReadinessProvider(), kubeconfig, **props)
    assert f"node {ibm}: runs IBM-managed drivers (kubelet v1.35.4+IKS, below 1.36) but has GPU Operator pods " \
           f"{gpu_operator}/nvidia-device-plugin-daemonset-x9" in str(e.value)


def test_a_switch_recorded_before_it_absorbed_the_rollback_and_readiness_checks_is_not_run_again():
    """Stacks deployed before hold `<node>-rollback` and `<node>-operator-ready` beside the switch (the same `up`
    deletes them): their switch shows no change for the inputs it gained."""
    provider = _NodePathSwitchProvider()
    base = {"node": "n1", "target": "device-plugin", "pilot_label": PILOT, "device_plugin_resource": "nvidia.com/gpu",
            "extended_resource": ER, "driver": DRIVER, "drain_timeout": 60, "switch_timeout": 60, "poll_interval": 1,
            "switched": False, "rolling_back": False}
    gained = {"check_image": "cuda", "check_namespace": NS, "check_timeout": 60, "operator_namespace": "gpu-operator",
              "operator_min_version": "1.36", "gpu_resources": [ER], "pending_gate": False, "ready_timeout": 60}
    assert not provider.diff("id", base, {**base, **gained}).changes  # no `~` for every migrated node after an upgrade
    gated = provider.diff("id", {**base, **gained}, {**base, **gained, "pending_gate": True})
    assert gated.replaces == ["pending_gate"]  # later, a changed gate runs the node's checks again


def test_a_switch_repeats_only_what_its_diff_and_read_use_and_its_settings_change_nothing():
    """Timeouts and the rollback check pod's settings steer a run (read from the new inputs): not repeated in the
    outputs (each copy costs every state save its bytes, per node) and no `~` when they change. A switch recorded
    when the outputs repeated every input diffs the same way."""
    provider = _NodePathSwitchProvider()
    inputs = {"kubeconfig": "/k", "node": "n1", "target": "device-plugin", "pilot_label": PILOT,
              "device_plugin_resource": "nvidia.com/gpu", "extended_resource": ER, "driver": DRIVER,
              "drain_timeout": 60, "switch_timeout": 60, "poll_interval": 1, "check_image": "cuda",
              "check_namespace": NS, "check_timeout": 60, "operator_namespace": "gpu-operator",
              "operator_min_version": "1.36", "gpu_resources": [ER], "pending_gate": False, "ready_timeout": 60,
              "config_name": "n1"}
    results = {"switched": False, "rolling_back": False, "ready": True, "pending": []}
    outs = {**provider._kept(inputs), **results}
    assert set(outs) - set(results) == {"kubeconfig", "node", "target", "pilot_label", "device_plugin_resource",
                                        "extended_resource", "driver", "operator_namespace", "gpu_resources",
                                        "pending_gate"}
    settings = {"drain_timeout": 900, "ready_timeout": 1200, "check_image": "cuda:13", "poll_interval": 5}
    for olds in (outs, {**inputs, **results}):  # trimmed outputs, and ones that repeated every input
        assert not provider.diff("id", olds, {**inputs, **settings}).changes
        assert provider.diff("id", olds, {**inputs, "target": "dra"}).replaces == ["target"]
        assert provider.diff("id", olds, {**inputs, "kubeconfig": "/other"}).changes  # read uses it: recorded
    updated = provider.update("id", {**inputs, **results}, {**inputs, "kubeconfig": "/other"}).outs
    assert updated == {**outs, "kubeconfig": "/other"}  # the results stay, the settings leave the outputs


class CheckPods:
    """Plays the scheduler and kubelet for the check pods the rollback verification creates: each is bound to the
    node its nodeSelector names and ends in `phase`, having printed `log` (like `nvidia-smi -L`)."""

    def __init__(self, kube, namespace):
        self.kube, self.namespace = kube, namespace
        self.created: list[dict] = []
        self.phase, self.log = "Succeeded", f"GPU 0: NVIDIA A100 (UUID: {UUID0})\n"

    def __call__(self, pod):
        self.created.append(pod)
        name = pod["metadata"]["name"]
        self.kube.bind(self.namespace, name, pod["spec"]["nodeSelector"]["kubernetes.io/hostname"])
        self.kube.set_log(self.namespace, name, self.log, container=pod["spec"]["containers"][0]["name"])
        if self.phase:
            self.kube.set_pod_status(self.namespace, name, {"phase": self.phase})


@pytest.fixture
def rolled_back(kube, ns, n1, monkeypatch):
    """n1 after the label switch: cordoned, device plugin not yet serving (it starts after the check's second look);
    pods it gets run like `nvidia-smi -L`."""
    kube.add_node(n1, unschedulable=True)
    pods = CheckPods(kube, ns)
    kube.on_pod_create(ns, pods)
    kube.after_calls(monkeypatch, cluster, "allocatable", 2, lambda: kube.set_allocatable(n1, {ER: "1"}))
    return pods


def no_pods(kube, ns):
    eventually(lambda: kube.pod_names(ns) == [], f"no pods left in {ns}")
    return True


def test_rollback_verification_passes_and_uncordons(kube, kubeconfig, rolled_back, ns, n1):
    outs = rollback(kubeconfig, kube)
    assert outs["gpu_uuid"] == UUID0 and outs["result"].startswith("passed")
    assert kube.unschedulable(n1) is False
    [pod] = rolled_back.created
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {ER: "1"}
    assert pod["spec"]["tolerations"][0]["key"] == "node.kubernetes.io/unschedulable"
    assert no_pods(kube, ns)  # the check pod was deleted
    assert annotation(kube) | {"checkedAt": None} == {
        "path": "device-plugin", "result": "passed", "gpu": UUID0, "checkedAt": None}


def test_rollback_verification_failure_leaves_node_cordoned(kube, kubeconfig, rolled_back, ns, n1):
    rolled_back.phase, rolled_back.log = "Failed", "no devices found"
    with pytest.raises(CheckFailed) as e:
        rollback(kubeconfig, kube)
    message = str(e.value)
    assert f"rollback of node {n1} to the device plugin failed" in message and f"node {n1} is left cordoned" in message
    assert "phase Failed" in message and "logs name no GPU UUID" in message
    assert kube.unschedulable(n1) is True
    assert no_pods(kube, ns)
    assert annotation(kube)["result"] == "failed"


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), Interrupted("shutting down"),
                                          ApiException(status=500, reason="boom")])
def test_interrupted_rollback_check_leaves_no_pod(kube, kubeconfig, rolled_back, monkeypatch, interruption, ns, n1):
    def interrupt(*_):
        raise interruption
    monkeypatch.setattr(cluster, "pod_log", interrupt)
    with pytest.raises(type(interruption)):
        rollback(kubeconfig, kube)
    assert len(rolled_back.created) == 1 and no_pods(kube, ns)
    assert kube.unschedulable(n1) is True


def test_rollback_check_deletes_a_pod_left_by_a_killed_run_and_bounds_its_own(kube, kubeconfig, rolled_back, ns,
                                                                              n1, n2):
    kube.add_pod(ns, "gpu-rollback-check-n1-old", node=n1, phase="Running", requests={ER: "1"},
                 labels={"app.kubernetes.io/name": "gpu-rollback-check", ROLLBACK_NODE_LABEL: n1})
    kube.add_pod(ns, "gpu-rollback-check-n2-old", node=n2, phase="Running",
                 labels={"app.kubernetes.io/name": "gpu-rollback-check", ROLLBACK_NODE_LABEL: n2})
    rollback(kubeconfig, kube)
    # only n1's leftover, and our own, are gone
    eventually(lambda: kube.pod_names(ns) == ["gpu-rollback-check-n2-old"], "n1's check pods deleted")
    [pod] = rolled_back.created
    assert pod["spec"]["activeDeadlineSeconds"] == 2  # FAST timeout: a pod orphaned by SIGKILL still stops


def test_failing_to_record_does_not_hide_the_rollback_failure(kube, kubeconfig, rolled_back, monkeypatch, ns, n1):
    rolled_back.phase = "Failed"
    kube.set_allocatable(n1, {ER: "1"})
    failing_patch_node(monkeypatch)
    with pytest.raises(CheckFailed) as e:
        rollback(kubeconfig, kube)
    message = str(e.value)
    assert f"rollback of node {n1} to the device plugin failed" in message and "phase Failed" in message
    assert f"node {n1} is left cordoned" in message and f"could not be recorded on node {n1}" in message
    assert no_pods(kube, ns)


def test_rollback_verification_times_out_when_device_plugin_never_serves(kube, kubeconfig, ns, n1):
    kube.add_node(n1, unschedulable=True)
    with pytest.raises(CheckFailed) as e:
        rollback(kubeconfig, kube, **SHORT)
    assert f"device plugin to offer example.com/gpu on node {n1}" in str(e.value) and "left cordoned" in str(e.value)
    assert kube.unschedulable(n1) is True and kube.pod_names(ns) == []


def test_rollback_verification_is_a_no_op_when_not_rolling_back(kube, kubeconfig, monkeypatch):
    requests = kube.record(monkeypatch)
    assert rollback(kubeconfig, kube, rolling_back=False)["result"] == "not rolling back"
    assert requests == []


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
        SmokeTestVerification("smoke", namespace=NS, pod_name="gpu-smoke-test-n1",
                                             pod_uid=pulumi.Output.from_input("uid-1"), node="n1", driver=DRIVER,
                                             extended_resource=ER, **common),
    ]
    drain_ = NodeDrain("drain", node="n1", pilot_label=PILOT, extended_resource=ER, **common)
    switch = NodePathSwitch(
        "switch", kubeconfig=None, node="n1", target="device-plugin", pilot_label=PILOT,
        device_plugin_resource="nvidia.com/gpu", extended_resource=ER, driver=DRIVER, drain_timeout=60,
        switch_timeout=60, poll_interval=1, rollback_check=RollbackCheck(image="cuda", namespace=NS, timeout=60),
        readiness=Readiness(operator_namespace="gpu-operator", timeout=60, operator_min_version="1.36",
                            gpu_resources=[ER]))
    declared += [
        drain_, switch,
        GpuNodeInventory("inventory", kubeconfig=None, configured={"n1": "dra"}, worker_ids={},
                                        operator_min_version="1.36"),
        OperandPlacement("placement", kubeconfig=None, namespace="gpu-operator", operator_min_version="1.36"),
    ]
    expected = {"pre": "_DraPreflightProvider", "smoke": "_SmokeTestVerificationProvider",
                "drain": "_NodeDrainProvider", "switch": "_NodePathSwitchProvider",
                "inventory": "_GpuNodeInventoryProvider", "placement": "_OperandPlacementProvider"}

    def check(values):
        rolling_back, gpu_uuid = values[:2]
        assert (rolling_back, gpu_uuid) == (True, UUID0)
        assert set(mocks.resources) == set(expected)
        for name, cls in expected.items():
            args = mocks.resources[name]
            assert args.typ.startswith("pulumi-python:dynamic/gpu-migration:")
            serialized = args.inputs["__provider"]  # a secret: {<secret sig>: ..., "value": <base64 dill>}
            provider = dill.loads(base64.b64decode(serialized["value"] if isinstance(serialized, dict) else serialized))
            assert type(provider).__name__ == cls
        inputs = mocks.resources["switch"].inputs
        assert (inputs["check_image"], inputs["operator_namespace"], inputs["ready_timeout"]) == ("cuda", "gpu-operator",
                                                                                                  60)

    # After every registration returned (their URNs): the check runs on all of them, not on those done so far.
    return pulumi.Output.all(drain_.rolling_back, declared[1].gpu_uuid, switch.result,
                             *[r.urn for r in declared]).apply(check)


test_resources_declare_and_providers_serialize = pulumi.runtime.test(test_resources_declare_and_providers_serialize)



def test_cancelled_up_deletes_the_rollback_check_pod(kube, kubeconfig, ns, n1):
    """SIGINT to the provider process while the check pod runs (poll interval 30s): the worker notices the shutdown
    instead of sleeping on, deletes the pod and the process exits (the engine would SIGKILL it after 5s; the wait
    below is only a hang guard)."""
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    kube.add_node(n1, allocatable={ER: "1"}, unschedulable=True)
    pods = CheckPods(kube, ns)
    pods.phase = None  # pods it gets stay Running
    kube.on_pod_create(ns, lambda pod: (pods(pod), kube.set_pod_status(ns, pod["metadata"]["name"], {
        "phase": "Running", "containerStatuses": [kube.container_status()]})))
    # stderr goes to a file, never a pipe nobody reads (a full pipe would block the host's logging).
    errors = tempfile.TemporaryFile(mode="w+")
    host = subprocess.Popen([sys.executable, str(Path(__file__).parent / "provider_host.py"), kubeconfig, n1, ns],
                            stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        assert host.stdout.readline().strip() == "started"

        def running():
            assert host.poll() is None, _read(errors)
            return [p for p in kube.pods(ns) if p["status"].get("phase") == "Running"]
        [pod] = eventually(running, "the check pod running", timeout=30)
        host.send_signal(signal.SIGINT)
        try:
            host.wait(timeout=60)
        except subprocess.TimeoutExpired:
            host.send_signal(signal.SIGUSR1)  # provider_host.py: faulthandler prints every thread's stack
            time.sleep(1)
            raise AssertionError(f"the provider host did not end within 60 s of SIGINT:\n{_read(errors)}") from None
    finally:
        if host.poll() is None:
            host.kill()
    # The provider deleted it (nothing else deletes pods here; the kubelet's part finishes the graceful deletion).
    assert no_pods(kube, ns) and [p["metadata"]["uid"] for p in pods.created] == [pod["metadata"]["uid"]]


def _read(file) -> str:
    file.seek(0)
    return file.read()[-20000:]


def test_inventory_and_placement_run_again_on_every_up(kube, kubeconfig):
    a, b = kube.name("a"), kube.name("b")
    kube.add_node(a, allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")
    provider = _GpuNodeInventoryProvider()
    props = dict(kubeconfig=kubeconfig, configured={a: "ibm-managed"}, worker_ids={}, operator_min_version="1.36")
    olds = provider.create(props).outs
    diff = provider.diff("id", olds, props)
    assert diff.changes and not diff.replaces  # an update, not a replacement
    kube.add_node(b, allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")  # joined since
    with pytest.raises(CheckFailed, match=f"GPU node {b}"):
        provider.update("id", olds, props)
    kube.delete_node(b)
    outs = provider.update("id", olds, props).outs
    assert outs["checked"] == [a] and outs["seen"] == {a: {"pool": "", "zone": ""}}


def test_a_batch_preflight_lets_dra_nodes_of_other_batches_publish(dra_cluster, api, n1):
    # n1 (pilot label, slices) is a dra node of an earlier batch; the check covers batch [n3] only.
    n3 = dra_cluster.name("n3")
    dra_cluster.add_node(n3, labels={"migration.example.com/gpu-dra": "pilot"})
    dra_cluster.add_slice(n3, DRIVER, {"gpu-1": "GPU-1"})
    pilot = "migration.example.com/gpu-dra=pilot"
    assert kube_preflight.preflight(api, DRIVER, ER, [n3], [n3], pilot_label=pilot) == []
    # A publisher without the pilot label, or a node of the batch that is not dra, is still refused.
    dra_cluster.patch_node(n1, {"metadata": {"labels": {"migration.example.com/gpu-dra": None}}})
    assert kube_preflight.preflight(api, DRIVER, ER, [n3], [n3], pilot_label=pilot) == [
        f"node {n1}: publishes 1 DRA devices of driver {DRIVER} but is not a dra node"]
    assert kube_preflight.preflight(api, DRIVER, ER, [], [n3], pilot_label=pilot) == [
        f"node {n1}: publishes 1 DRA devices of driver {DRIVER} but is not a dra node",
        f"node {n3}: publishes 1 DRA devices of driver {DRIVER} but is not a dra node"]


def test_the_inventory_names_the_nodes_out_before_the_run_which_take_the_first_slots(kube, kubeconfig):
    """resume_first: entries whose node this program cordoned (an earlier `up` stopped while they were in flight) and
    entries whose node is NotReady; not a node someone else cordoned, not an ibm-managed entry (components/slots.py)."""
    ours, broken, theirs, fine, ibm = (kube.name(n) for n in ("ours", "broken", "theirs", "fine", "ibm"))
    for name in (ours, broken, theirs, fine):
        kube.add_node(name, labels={"nvidia.com/gpu.present": "true"}, kubelet_version="v1.36.1+IKS")
    kube.add_node(ibm, labels={"nvidia.com/gpu.present": "true"}, kubelet_version="v1.35.4+IKS")
    kube.cordon(ours, annotations={CORDON_ANNOTATION: "replace"})
    kube.cordon(theirs)
    kube.set_ready(broken, False)
    kube.set_ready(ibm, False)
    configured = {fine: "device-plugin", theirs: "dra", broken: "device-plugin", ours: "dra", ibm: "ibm-managed"}
    out = create(_GpuNodeInventoryProvider(), kubeconfig, configured=configured, worker_ids={},
                 operator_min_version="1.36")
    assert out["resume_first"] == [broken, ours]  # config order
