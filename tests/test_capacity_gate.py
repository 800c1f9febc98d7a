"""CapacityGate against the local Kubernetes API emulator: it counts GPU nodes from the cluster and waits, bounded."""
import time

import pytest

from iks_gpu_migration.kube.capacity_gate import _CapacityGateProvider
from iks_gpu_migration.kube.records import CONFIG_NAME_ANNOTATION
from iks_gpu_migration.kube.cordon import CORDON_ANNOTATION
from iks_gpu_migration.kube.provider import CheckFailed
from tests.emulators.kube import KubeEmulator

GPU = {"nvidia.com/gpu.present": "true"}


@pytest.fixture
def kube():
    emulator = KubeEmulator().start()
    for i in range(1, 6):
        emulator.add_node(f"n{i}", labels=GPU)
    emulator.add_node("cpu-1")  # not a GPU node: never counted
    yield emulator
    emulator.stop()


def gate(kube, tmp_path, **overrides):
    props = {"kubeconfig": kube.write_kubeconfig(tmp_path / "kubeconfig"), "index": 2, "batch": ["n1", "n2"],
             "stages": {"n1": "dra", "n2": "dra"}, "after": ["n0"], "selector": "nvidia.com/gpu.present=true",
             "min_available": 3, "soak_seconds": 0, "timeout": 2, "poll_interval": 0.01, **overrides}
    return _CapacityGateProvider().create(props).outs


def test_opens_when_the_batch_fits(kube, tmp_path):
    assert gate(kube, tmp_path)["opened"] == "3 GPU nodes available outside the batch, 3 needed"


def test_a_cordoned_node_blocks_the_batch_until_the_timeout_naming_it(kube, tmp_path):
    kube.nodes["n4"]["spec"]["unschedulable"] = True
    with pytest.raises(CheckFailed) as e:
        gate(kube, tmp_path, timeout=0.3)
    assert "timed out after 0s waiting for capacity for batch 2 (n1, n2)" in str(e.value)
    assert "2 GPU nodes available outside the batch, 3 needed; unavailable: n4 (cordoned)" in str(e.value)
    assert "batch 2 was not started, none of its nodes was changed" in str(e.value)
    assert not [r for r in kube.requests if r[0] != "GET"]  # the gate only reads


def test_waits_until_a_not_ready_node_recovers(kube, tmp_path):
    kube.nodes["n5"]["status"]["conditions"][0]["status"] = "False"

    def recover():
        kube.nodes["n5"]["status"]["conditions"][0]["status"] = "True"

    kube.after(3, "/api/v1/nodes", recover)
    assert gate(kube, tmp_path)["opened"].startswith("3 GPU nodes available")
    assert sum(1 for m, p in kube.requests if p.startswith("/api/v1/nodes")) >= 4  # it polled while blocked


def test_soaks_after_the_previous_batch(kube, tmp_path):
    started = time.monotonic()
    gate(kube, tmp_path, soak_seconds=0.3)
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    gate(kube, tmp_path, soak_seconds=30, after=[])  # the first batch has nothing to soak after
    assert time.monotonic() - started < 5


def test_reruns_when_its_batch_or_stages_change():
    provider, olds = _CapacityGateProvider(), {"batch": ["n1"], "stages": {"n1": "device-plugin"}, "min_available": 3,
                                               "selector": "a=b", "after": ["n0"]}
    assert not provider.diff("id", olds, dict(olds)).changes
    rerun = provider.diff("id", olds, {**olds, "stages": {"n1": "dra"}})
    assert rerun.replaces == ["stages"] and not rerun.delete_before_replace  # a dra switch is gated again
    assert not provider.diff("id", olds, {**olds, "after": ["10.9.9.9"]}).replaces


def test_a_node_this_program_cordoned_counts_against_the_budget(kube, tmp_path):
    # E.g. a dra node of the previous batch still held for its smoke test: it serves no GPU workloads, whoever
    # cordoned it (the next batch starts only once it is verified and uncordoned: migration.py done_by).
    kube.nodes["n4"]["spec"]["unschedulable"] = True
    kube.nodes["n4"]["metadata"].setdefault("annotations", {})[CORDON_ANNOTATION] = "dra"
    with pytest.raises(CheckFailed) as e:
        gate(kube, tmp_path, timeout=0.3)
    assert "unavailable: n4 (cordoned)" in str(e.value)


def test_batch_members_renamed_by_their_replacement_are_still_the_batch(kube, tmp_path):
    # A kubeVersion round (or a stage change) after the first replacement: n1's node is now r1, tied to its config
    # entry by the annotation its readiness check wrote. It is in the batch, not spare capacity outside it.
    kube.add_node("r1", labels=GPU)["metadata"]["annotations"] = {CONFIG_NAME_ANNOTATION: "n1"}
    del kube.nodes["n1"]
    kube.nodes["n5"]["status"]["conditions"][0]["status"] = "False"
    with pytest.raises(CheckFailed) as e:
        gate(kube, tmp_path, timeout=0.3)
    assert "2 GPU nodes available outside the batch, 3 needed; unavailable: n5 (NotReady)" in str(e.value)


def test_reruns_when_the_kube_version_changes():
    # Every node of the batch is replaced again at the new version: its capacity is counted again.
    provider, olds = _CapacityGateProvider(), {"batch": ["n1"], "kube_version": "1.36"}
    assert provider.diff("id", olds, {**olds, "kube_version": "1.37"}).replaces == ["kube_version"]
