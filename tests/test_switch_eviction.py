"""The dra switch evicts its GPU pods instead of waiting for them to end, when asked (drain.switchGpuPods: evict;
issue 37 §3): under the same `drain:` rules as the drain before a replacement (PodDisruptionBudgets respected, bare
pods only with drain.force), only the pods the switch would wait for, and the default still waits. Against the real
API server (tests/envtest.py), GpuNode playing the device plugin, the DRA kubelet plugin and the kubelet."""
import copy

import pytest

from harness import run_program, stack_config
from iks_gpu_migration.config import ConfigError, parse
from iks_gpu_migration.kube.provider import CheckFailed
from test_node_switch import GPU, PILOT, _state, n1, node, settled, switch, training_pod  # noqa: F401 - fixtures

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "inference-7d9",
         "uid": "1f7c2a3e-0000-4000-8000-0000000000a1", "controller": True}


def inference_pod(kube, name="inference", path="device-plugin"):
    """A long-running GPU pod a ReplicaSet re-creates elsewhere (it never ends by itself)."""
    status = {} if path == "device-plugin" else {
        "extendedResourceClaimStatus": {"resourceClaimName": f"{name}-claim", "requestMappings": [
            {"containerName": "main", "resourceName": GPU, "requestName": "container-0-request-0"}]}}
    return kube.add_pod(kube.ns("ml"), name, node=kube.name("n1"), requests={GPU: "1"}, labels={"app": name},
                        owner=OWNER, **status)


def evicting(**drain):
    return {"gpu_pods": "evict", "drain_rules": drain}


def test_forward_evicts_a_long_running_gpu_pod_once_its_budget_allows(kube, kubeconfig, node, n1, monkeypatch):
    ml = kube.ns("ml")
    inference_pod(kube)
    kube.add_pod(ml, "web", node=n1)  # no GPU: the switch leaves it
    kube.add_pdb(ml, "inference", {"app": "inference"}, disruptions_allowed=0)
    from iks_gpu_migration.kube import eviction
    kube.after_calls(monkeypatch, eviction._Drain, "_poll", 3, lambda: kube.set_pdb_allowed(ml, "inference", 1))
    assert switch(kubeconfig, n1, "dra", drain=20, **evicting())["switched"] is True
    assert kube.pod_or_none(ml, "inference") is None and kube.pod_or_none(ml, "web") is not None
    settled(kube, (True, "false", PILOT[1], "0", True))
    assert node.violations == []


def test_a_budget_that_never_allows_leaves_the_node_cordoned_on_its_path(kube, kubeconfig, node, n1):
    ml = kube.ns("ml")
    inference_pod(kube)
    kube.add_pdb(ml, "inference", {"app": "inference"}, disruptions_allowed=0)
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, n1, "dra", drain=0.5, **evicting())
    message = str(e.value)
    assert f"{ml}/inference (PodDisruptionBudget {ml}/inference allows 0 disruptions now" in message
    assert "its GPU path was not switched" in message and "gpu-migration:timeouts.drain bounds this wait" in message
    assert f"node {n1} is left cordoned, its device plugin still on and no pilot label" in message
    assert _state(kube) == (True, "true", None, "1", False)
    assert kube.pod_or_none(ml, "inference") is not None


def test_a_bare_gpu_pod_is_evicted_only_with_drain_force(kube, kubeconfig, node, n1):
    ml = kube.ns("ml")
    training_pod(kube)  # no controller: nothing re-creates it
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, n1, "dra", drain=2, **evicting())
    assert f"{ml}/training" in str(e.value) and "Nothing was evicted" in str(e.value)
    assert kube.pod_or_none(ml, "training") is not None
    assert switch(kubeconfig, n1, "dra", drain=10, **evicting(force=True))["switched"] is True
    assert kube.pod_or_none(ml, "training") is None


def test_rollback_evicts_the_dra_pods_too(kube, kubeconfig, node, n1):
    assert switch(kubeconfig, n1, "dra")["switched"] is True
    settled(kube, (True, "false", PILOT[1], "0", True))
    ml = kube.ns("ml")
    inference_pod(kube, path="dra")
    assert switch(kubeconfig, n1, "device-plugin", drain=20, **evicting())["rolling_back"] is True
    assert kube.pod_or_none(ml, "inference") is None
    settled(kube, (True, "true", None, "1", False))
    assert node.violations == []


def test_by_default_the_switch_waits_and_evicts_nothing(kube, kubeconfig, node, n1):
    ml = kube.ns("ml")
    inference_pod(kube)
    with pytest.raises(CheckFailed) as e:
        switch(kubeconfig, n1, "dra", drain=0.3)
    assert f"device-plugin GPU pods on node {n1} to finish or move" in str(e.value)
    assert kube.pod_or_none(ml, "inference") is not None


def test_the_key_reaches_every_switch_and_is_checked():
    raw = copy.deepcopy(stack_config("pilot"))
    assert parse(raw).drain.switch_gpu_pods == "wait"
    switches = [r for r in run_program(raw).registered if r.name.endswith("-switch")]
    assert switches and all("gpu_pods" not in r.inputs and "drain_rules" not in r.inputs for r in switches)
    raw["drain"] = {"force": True, "switchGpuPods": "evict"}
    switches = [r for r in run_program(raw).registered if r.name.endswith("-switch")]
    assert switches and all(r.inputs["gpu_pods"] == "evict" and r.inputs["drain_rules"]["force"] is True
                            for r in switches)
    raw["drain"] = {"switchGpuPods": "drain"}
    with pytest.raises(ConfigError) as e:
        parse(raw)
    assert "gpu-migration:drain.switchGpuPods: " in str(e.value)
