"""The kubeconfig's cluster must be the IKS cluster `clusterName` names before anything changes: the decision (pure),
and the check against the real API server (envtest) and the IKS emulator."""
import pytest

from iks_gpu_migration.iks.identity import ClusterIdentityProvider, ClusterMismatch, mismatch
from iks_gpu_migration.kube.inventory import IKS_WORKER_ID_LABEL
from tests.emulators.iks import IksEmulator

TARGET = "context prod, server https://c1.us-south.containers.cloud.ibm.com:30000"
GPU = {"nvidia.com/gpu.present": "true"}


def test_nodes_of_the_named_cluster_pass():
    nodes = [("10.0.0.1", "kube-c1-gpu-1", True), ("10.0.0.2", "kube-c1-gpu-2", True), ("10.0.0.9", "", False)]
    assert mismatch(nodes, {"kube-c1-gpu-1", "kube-c1-gpu-2", "kube-c1-default-1"}, "c1", TARGET) is None


def test_a_gpu_node_of_another_cluster_is_named_with_the_kubeconfig_and_the_cluster():
    nodes = [("10.0.0.1", "kube-c1-gpu-1", True), ("10.1.0.7", "kube-c2-gpu-7", True)]
    problem = mismatch(nodes, {"kube-c1-gpu-1"}, "c1", TARGET)
    assert problem.startswith(f"the kubeconfig's cluster ({TARGET}) is not IKS cluster c1 (gpu-migration:clusterName)")
    assert "node 10.1.0.7 (worker kube-c2-gpu-7) is not among the 1 workers IKS lists for c1" in problem
    assert "ibmcloud ks cluster config --cluster c1" in problem and "Nothing was changed" in problem


def test_many_foreign_nodes_are_summed_up():
    nodes = [(f"10.1.0.{i}", f"kube-c2-gpu-{i}", True) for i in range(5)]
    problem = mismatch(nodes, {"kube-c1-gpu-1"}, "c1", TARGET)
    assert "node 10.1.0.2 (worker kube-c2-gpu-2) and 2 more are not among" in problem


def test_without_labelled_gpu_nodes_the_other_workers_decide():
    """Every GPU worker mid-replacement: their nodes are gone, the cluster's other workers still tie it to IKS."""
    nodes = [("10.0.0.5", "kube-c1-default-1", False), ("10.0.0.6", "", True)]
    assert mismatch(nodes, {"kube-c1-default-1"}, "c1", TARGET) is None
    assert "node 10.0.0.5 (worker kube-c1-default-1)" in mismatch(nodes, {"kube-c1-gpu-1"}, "c1", TARGET)


def test_a_cluster_without_iks_labels_is_not_taken_for_an_iks_cluster():
    problem = mismatch([("gpu-0", "", True), ("cpu-0", "", False)], {"kube-c1-gpu-1"}, "c1", TARGET)
    assert f"has no node labelled {IKS_WORKER_ID_LABEL}, so it can't be tied to IKS cluster c1" in problem


@pytest.fixture
def emu():
    emulator = IksEmulator(master_version="1.37.0_1501").start()
    yield emulator
    emulator.stop()


def test_check_against_the_api_server_and_the_iks_emulator(kube, kubeconfig, emu):
    for _ in range(2):
        worker = emu.add_worker(version="1.36.1_1530")
        kube.add_node(kube.name(worker["networkInterfaces"][0]["ipAddress"]),
                      labels={**GPU, IKS_WORKER_ID_LABEL: worker["id"]})
    props = {"cluster": "gpu-cluster", "kubeconfig": kubeconfig, "api": emu.api()}
    outs = ClusterIdentityProvider().create(props).outs
    assert outs["nodes_checked"] >= 2 and "api_key" not in outs["api"]

    stray = kube.name("10.9.9.9")
    kube.add_node(stray, labels={**GPU, IKS_WORKER_ID_LABEL: "kube-othercluster-gpu-00000001"})
    with pytest.raises(ClusterMismatch) as stopped:
        ClusterIdentityProvider().update("id", outs, props)
    message = str(stopped.value)
    server = kube.api.configuration.host
    assert f"the kubeconfig's cluster (context local, server {server}) is not IKS cluster gpu-cluster" in message
    assert f"node {stray} (worker kube-othercluster-gpu-00000001) is not among the 2 workers" in message
    assert {m for m, _ in emu.requests} <= {"GET", "POST"} and emu.count("POST", "/v2/vpc/replaceWorker") == 0


@pytest.mark.parametrize("kind, named", [
    ({"provider": "classic"}, "its provider is 'classic' (classic infrastructure: workers are replaced with POST "
                              "/v2/replaceWorker"),
    ({"provider": "vpc-classic"}, "its provider is 'vpc-classic' (not on VPC Gen 2)"),
    ({"type": "openshift"}, "it is a Red Hat OpenShift on IBM Cloud cluster"),
    ({"masterKubeVersion": "4.17.10_1540_openshift"}, "its GPU Operator comes through OLM"),
])
def test_a_classic_or_openshift_cluster_is_refused_before_anything(kube, kubeconfig, emu, kind, named):
    """Issue 37 §4: clusters the program can't serve are refused in the identity check, which every change waits
    for, naming what differs; nothing is read beyond the cluster and nothing changes."""
    emu.cluster.update(kind)
    props = {"cluster": "gpu-cluster", "kubeconfig": kubeconfig, "api": emu.api()}
    with pytest.raises(ClusterMismatch) as refused:
        ClusterIdentityProvider().create(props)
    assert named in str(refused.value) and str(refused.value).endswith("Nothing was changed")
    assert "IKS cluster gpu-cluster (gpu-migration:clusterName) is not a cluster this program can migrate" in \
        str(refused.value)
    assert emu.count("GET", "/v2/vpc/getWorkers") == 0 and {m for m, _ in emu.requests} <= {"GET", "POST"}


def test_a_vpc_gen2_kubernetes_cluster_and_one_whose_answer_lacks_the_fields_pass():
    from iks_gpu_migration.plan.iks_rules import cluster_kind_refusal
    assert cluster_kind_refusal("c", {"provider": "vpc-gen2", "type": "kubernetes",
                                      "masterKubeVersion": "1.37.0_1501"}) is None
    assert cluster_kind_refusal("c", {"masterKubeVersion": "1.37.0_1501"}) is None
