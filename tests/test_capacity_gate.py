"""CapacityGate against the real API server (tests/envtest.py): it counts GPU nodes from the cluster and waits,
bounded."""
import time

import pytest

from iks_gpu_migration.kube.capacity_gate import _CapacityGateProvider
from iks_gpu_migration.kube.records import CONFIG_NAME_ANNOTATION
from iks_gpu_migration.kube.cordon import CORDON_ANNOTATION
from iks_gpu_migration.kube.provider import CheckFailed

GPU = {"nvidia.com/gpu.present": "true"}


@pytest.fixture
def kube(kube):
    for i in range(1, 6):
        kube.add_node(kube.name(f"n{i}"), labels=GPU)
    kube.add_node(kube.name("cpu-1"))  # not a GPU node: never counted
    return kube


def gate(kube, tmp_path, **overrides):
    n1, n2 = kube.name("n1"), kube.name("n2")
    # n1's turn, n2 in flight beside it (its slot: components/slots.py), n0's end freed the slot.
    props = {"kubeconfig": kube.kubeconfig, "index": 2, "batch": [n1], "slot": {"peers": [n2], "freed_by": "n0"},
             "stages": {n1: "dra"}, "after": ["n0"], "selector": "nvidia.com/gpu.present=true",
             "min_available": 3, "soak_seconds": 0, "timeout": 2, "poll_interval": 0.01, **overrides}
    return _CapacityGateProvider().create(props).outs


def test_opens_when_the_batch_fits(kube, tmp_path):
    assert gate(kube, tmp_path)["opened"] == "3 GPU nodes available outside the batch, 3 needed"


def test_a_cordoned_node_blocks_the_batch_until_the_timeout_naming_it(kube, tmp_path, monkeypatch):
    n1, n2, n4 = kube.name("n1"), kube.name("n2"), kube.name("n4")
    kube.cordon(n4)
    requests = kube.record(monkeypatch)
    with pytest.raises(CheckFailed) as e:
        gate(kube, tmp_path, timeout=0.3)
    assert f"timed out after 0s waiting for capacity for node {n1} beside 1 in flight ({n2})" in str(e.value)
    assert f"2 GPU nodes available outside the batch, 3 needed; unavailable: {n4} (cordoned)" in str(e.value)
    assert f"node {n1} was not started, nothing of it was changed" in str(e.value)
    assert requests and not [r for r in requests if r[0] != "GET"]  # the gate only reads


def test_waits_until_a_not_ready_node_recovers(kube, tmp_path, monkeypatch):
    from iks_gpu_migration import plan
    n5 = kube.name("n5")
    kube.set_ready(n5, False)
    polls = kube.after_calls(monkeypatch, plan, "gate_decision", 3, lambda: kube.set_ready(n5, True))
    assert gate(kube, tmp_path)["opened"].startswith("3 GPU nodes available")
    assert len(polls) >= 4  # it polled while blocked


def test_soaks_after_the_node_that_freed_its_slot(kube, tmp_path):
    started = time.monotonic()
    gate(kube, tmp_path, soak_seconds=0.3)
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    # One of the first slots: nothing to soak after.
    gate(kube, tmp_path, soak_seconds=30, slot={"peers": [kube.name("n2")], "freed_by": ""})
    assert time.monotonic() - started < 5


def test_the_slot_steers_a_run_but_never_runs_a_gate_again():
    """Which nodes are in flight differs every `up`: a recorded gate is not run again for it (nor for its position
    or timeouts); its node, stage, budget, selector or kubeVersion do."""
    provider = _CapacityGateProvider()
    olds = {"batch": ["n1"], "stages": {"n1": "device-plugin"}, "min_available": 3, "selector": "a=b",
            "kube_version": "1.36", "kubeconfig": None, "slot": {"peers": ["n0"], "freed_by": "n9"}, "index": 2,
            "timeout": 60, "opened": "3 GPU nodes available"}
    news = {**olds, "slot": {"peers": [], "freed_by": ""}, "index": 7, "timeout": 120}
    news.pop("opened")
    assert not provider.diff("id", olds, news).changes
    assert provider.diff("id", olds, {**news, "min_available": 2}).replaces == ["min_available"]


def test_reruns_when_its_batch_or_stages_change():
    provider, olds = _CapacityGateProvider(), {"batch": ["n1"], "stages": {"n1": "device-plugin"}, "min_available": 3,
                                               "selector": "a=b", "after": ["n0"]}
    assert not provider.diff("id", olds, dict(olds)).changes
    rerun = provider.diff("id", olds, {**olds, "stages": {"n1": "dra"}})
    assert rerun.replaces == ["stages"] and not rerun.delete_before_replace  # a dra switch is gated again
    assert not provider.diff("id", olds, {**olds, "after": ["10.9.9.9"]}).replaces


def test_a_node_this_program_cordoned_counts_against_the_budget(kube, tmp_path):
    # E.g. a dra node of the previous batch still held for its smoke test: it serves no GPU workloads, whoever
    # cordoned it (the next batch starts only once it is verified and uncordoned: components/gpu_node.py done_by).
    n4 = kube.name("n4")
    kube.cordon(n4, annotations={CORDON_ANNOTATION: "dra"})
    with pytest.raises(CheckFailed) as e:
        gate(kube, tmp_path, timeout=0.3)
    assert f"unavailable: {n4} (cordoned)" in str(e.value)


def test_batch_members_renamed_by_their_replacement_are_still_the_batch(kube, tmp_path):
    # A kubeVersion round (or a stage change) after the first replacement: n1's node is now r1, tied to its config
    # entry by the annotation its readiness check wrote. It is in the batch, not spare capacity outside it.
    kube.add_node(kube.name("r1"), labels=GPU, annotations={CONFIG_NAME_ANNOTATION: kube.name("n1")})
    kube.delete_node(kube.name("n1"))
    kube.set_ready(kube.name("n5"), False)
    with pytest.raises(CheckFailed) as e:
        gate(kube, tmp_path, timeout=0.3)
    assert f"2 GPU nodes available outside the batch, 3 needed; unavailable: {kube.name('n5')} (NotReady)" in str(
        e.value)


def test_reruns_when_the_kube_version_changes():
    # Every node of the batch is replaced again at the new version: its capacity is counted again.
    provider, olds = _CapacityGateProvider(), {"batch": ["n1"], "kube_version": "1.36"}
    assert provider.diff("id", olds, {**olds, "kube_version": "1.37"}).replaces == ["kube_version"]


def test_the_default_selector_counts_nodes_still_on_ibms_drivers(kube, tmp_path):
    # Before the GPU Operator only IKS labels a GPU worker: n3 and n4 carry IKS's label instead of the operator's.
    from iks_gpu_migration.plan import DEFAULT_GPU_NODE_SELECTOR
    for n in ("n3", "n4"):
        kube.delete_node(kube.name(n))
        kube.add_node(kube.name(n), labels={"ibm-cloud.kubernetes.io/gpu-enabled": "true",
                                            "ibm-cloud.kubernetes.io/machine-type": "gx3.16x80.l4"})
    assert gate(kube, tmp_path, selector=DEFAULT_GPU_NODE_SELECTOR)["opened"].startswith("3 GPU nodes available")
    with pytest.raises(CheckFailed) as e:  # the operator's label alone misses them, and the gate says so
        gate(kube, tmp_path, timeout=0.3)
    assert (f"2 GPU node(s) not matched by gpuNodeSelector 'nvidia.com/gpu.present=true', so not counted: "
            f"{kube.name('n3')} (ibm-cloud.kubernetes.io/gpu-enabled=true, ibm-cloud.kubernetes.io/machine-type="
            f"gx3.16x80.l4), {kube.name('n4')} (") in str(e.value)


def test_a_gate_that_opens_short_of_gpu_nodes_warns_naming_them(kube, tmp_path, monkeypatch):
    import pulumi
    kube.add_node(kube.name("ibm-1"), allocatable={"nvidia.com/gpu": "1"})  # IBM's device plugin, no GPU label
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(message))
    assert gate(kube, tmp_path)["opened"].startswith("3 GPU nodes available")
    assert warnings == [f"node {kube.name('n1')}: the capacity budget does not count every GPU node; 1 GPU node(s) "
                        f"not matched by gpuNodeSelector 'nvidia.com/gpu.present=true', so not counted: "
                        f"{kube.name('ibm-1')} "
                        f"(nvidia.com/gpu capacity); set gpu-migration:gpuNodeSelector to labels every GPU node "
                        f"carries (alternatives separated by |, e.g. ibm-cloud.kubernetes.io/gpu-enabled=true|"
                        f"nvidia.com/gpu.present=true)"]


def test_a_gate_recorded_with_the_old_default_does_not_run_again_for_the_new_one():
    from iks_gpu_migration.plan import DEFAULT_GPU_NODE_SELECTOR
    provider = _CapacityGateProvider()
    olds = {"batch": ["n1"], "min_available": 3, "selector": "nvidia.com/gpu.present=true", "after": ["n0"]}
    assert not provider.diff("id", olds, {**olds, "selector": DEFAULT_GPU_NODE_SELECTOR}).changes
    assert provider.diff("id", olds, {**olds, "selector": "pool=gpu"}).replaces == ["selector"]  # a user's change
    assert provider.diff("id", {**olds, "selector": DEFAULT_GPU_NODE_SELECTOR},
                         {**olds, "selector": "nvidia.com/gpu.present=true"}).replaces == ["selector"]
