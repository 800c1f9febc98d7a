"""A fleet split over several stacks (docs/fleet-scale.md#one-fleet-several-stacks), against the real API server
(tests/envtest.py) and the IKS emulator: a stack's inventory covers its worker pools; the cluster stack installs the
GPU Operator only once every pool is fenced; a pool stack waits for the master and the operator."""
import copy

import pytest
from kubernetes import config as kconfig

from harness import run_program, stack_config
from iks_gpu_migration.iks.provider import ReplacementError
from iks_gpu_migration.iks.shared_cluster import SharedClusterReadyProvider
from iks_gpu_migration.kube import inventory as kube_inventory
from iks_gpu_migration.kube.fence import _ClusterFencedProvider
from iks_gpu_migration.kube.labels import IBM_MANAGED_LABELS
from iks_gpu_migration.kube.provider import CheckFailed
from tests.emulators.iks import IksEmulator

POOL = "ibm-cloud.kubernetes.io/worker-pool-name"
GPU = {"ibm-cloud.kubernetes.io/gpu-enabled": "true"}


def pool_nodes(kube):
    """a1 (pool gpu-a), b1 (gpu-b), both on IBM's drivers."""
    a1, b1 = kube.name("a1"), kube.name("b1")
    kube.add_node(a1, labels={**GPU, POOL: "gpu-a"}, kubelet_version="v1.35.4+IKS")
    kube.add_node(b1, labels={**GPU, POOL: "gpu-b"}, kubelet_version="v1.35.4+IKS")
    return a1, b1


def test_a_stacks_inventory_covers_its_worker_pools_only(kube):
    a1, b1 = pool_nodes(kube)
    with kconfig.new_client_from_config(config_file=kube.kubeconfig) as api:
        def problems(configured, pools):
            return kube_inventory.inventory(api, configured, {}, "1.36", worker_pools=pools).problems
        assert problems({a1: "device-plugin"}, ["gpu-a"]) == []  # b1 is another stack's
        assert any(f"GPU node {b1}" in p for p in problems({a1: "device-plugin"}, None))  # one stack: all its own
        assert problems({a1: "device-plugin", b1: "device-plugin"}, ["gpu-a"]) == [
            f"node {b1} (gpu-migration:nodes entry {b1}) is in worker pool gpu-b, outside gpu-migration:workerPools "
            f"['gpu-a']: list it in the stack of its pool"]
        assert any(f"GPU node {a1}" in p for p in problems({}, ["gpu-a"]))  # its own pool's nodes must be listed


def test_the_operator_waits_until_every_pool_is_fenced_and_names_the_node_that_is_not(kube, monkeypatch):
    from iks_gpu_migration.kube import fence
    a1, b1 = pool_nodes(kube)
    kube.patch_node(a1, {"metadata": {"labels": IBM_MANAGED_LABELS}})  # this stack's own fence
    props = {"kubeconfig": kube.kubeconfig, "labels": IBM_MANAGED_LABELS, "operator_min_version": "1.36",
             "timeout": 0.5, "poll_interval": 0.05}
    with pytest.raises(CheckFailed) as e:
        _ClusterFencedProvider().create(props)
    assert f"1 GPU node(s) on IBM's drivers not fenced yet: {b1} (worker pool gpu-b, kubelet v1.35.4+IKS)" in \
        str(e.value)
    assert "the GPU Operator was not installed" in str(e.value)
    polls = kube.after_calls(monkeypatch, fence, "unfenced", 3, lambda: kube.patch_node(
        b1, {"metadata": {"labels": IBM_MANAGED_LABELS}}))  # the other stack's `up` fences its node meanwhile
    assert _ClusterFencedProvider().create({**props, "timeout": 10}).outs["fenced_everywhere"] is True
    assert len(polls) >= 4


def test_a_pool_stack_waits_for_the_master_and_the_operator_of_the_cluster_stack(kube):
    emu = IksEmulator(master_version="1.36.1_1530").start()
    try:
        ns = kube.ns("gpu-operator")
        props = {"cluster": "gpu-cluster", "version": "1.37", "api": emu.api(), "kubeconfig": kube.kubeconfig,
                 "namespace": ns, "timeout": 0.5, "poll_interval": 0.05}
        with pytest.raises(ReplacementError) as e:
            SharedClusterReadyProvider().create(props)
        assert "master 1.36.1_1530" in str(e.value) and f"no ready GPU Operator pod (app=gpu-operator) in namespace " \
            f"{ns}" in str(e.value)
        assert "Run `pulumi up` of the stack with gpu-migration:clusterComponents: true" in str(e.value)
        from iks_gpu_migration.iks.api import IksClient
        IksClient.from_api(emu.api()).update_master("gpu-cluster", "1.37")  # the cluster stack's master update
        node = kube.name("cpu-1")
        kube.add_node(node)
        kube.add_pod(ns, "gpu-operator-1", node=node, labels={"app": "gpu-operator"})
        outs = SharedClusterReadyProvider().create({**props, "timeout": 30}).outs
        assert "GPU Operator pod gpu-operator-1 ready" in outs["ready"] and "api_key" not in outs["api"]
    finally:
        emu.stop()


def test_a_pool_stack_declares_no_master_operator_or_dra_path_and_the_cluster_stack_a_cluster_wide_fence():
    raw = copy.deepcopy(stack_config("pilot"))
    for node in raw["nodes"]:
        node["stage"] = "device-plugin"
    split = {"workerPools": ["gpu-b"], "sharedBudget": {"name": "fleet", "maxUnavailable": 2}}
    pool = run_program({**raw, **split, "clusterComponents": False})
    types = {r.typ for r in pool.registered}
    assert "gpu-migration:index:GpuOperator" not in types and "kubernetes:helm.sh/v3:Release" not in types
    assert "pulumi:providers:kubernetes" not in types  # no Kubernetes resource, no provider plugin
    ready = pool.named("shared-cluster-ready")
    assert ready.inputs["version"] == raw["kubeVersion"] and "master-version" not in pool.names()
    shared = pool.named("shared-budget-release").inputs["shared"]
    # The stack's unique name comes from its SharedBudgetHolder (an ID drawn once, kept in state); its plain name
    # only finds claims written before.
    assert shared["legacy_holder"] == "organization/gpu-migration/test" and shared["claim_ttl"] == 600
    assert pool.named("shared-budget-holder").inputs["base"] == "organization/gpu-migration/test"
    assert all(g.inputs["shared"]["max_unavailable"] == 2 for g in pool.registered if g.name.endswith("-gate"))
    assert pool.named("gpu-node-inventory").inputs["worker_pools"] == ["gpu-b"]
    cluster = run_program({**raw, **split, "workerPools": ["gpu-a"]})
    fenced = cluster.named("cluster-fenced")
    assert fenced.inputs["labels"] == IBM_MANAGED_LABELS and cluster.depends("gpu-operator", "cluster-fenced")
    single = run_program(raw)  # one stack per cluster: as before, no new inputs
    assert "cluster-fenced" not in single.names() and "shared-budget-release" not in single.names()
    assert all("shared" not in g.inputs for g in single.registered if g.name.endswith("-gate"))
