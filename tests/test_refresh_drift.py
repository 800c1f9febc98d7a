"""What `pulumi refresh` records and how the next `up` reacts (the real-engine scenario runs both end to end)."""
from iks_gpu_migration.iks.replacement import WorkerReplacementProvider
from iks_gpu_migration.kube.switch import _NodePathSwitchProvider, observed_path

PILOT = "migration.example.com/gpu-dra=pilot"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"


def test_observed_path_from_labels():
    assert observed_path({"migration.example.com/gpu-dra": "pilot", PLUGIN: "false"}, PILOT) == "dra"
    assert observed_path({PLUGIN: "true"}, PILOT) == "device-plugin"
    assert observed_path({}, PILOT) == "device-plugin"
    assert observed_path({PLUGIN: "false"}, PILOT) == "mixed"  # a removed pilot label
    assert observed_path({"migration.example.com/gpu-dra": "other", PLUGIN: "false"}, PILOT) == "mixed"


def test_switch_runs_again_when_refresh_saw_the_node_off_its_path():
    p = _NodePathSwitchProvider()
    news = {"node": "n", "target": "dra", "pilot_label": PILOT}
    assert not p.diff("id", {**news}, news).changes
    assert not p.diff("id", {**news, "observed_path": "dra"}, news).changes
    drift = p.diff("id", {**news, "observed_path": "mixed"}, news)
    assert drift.changes and "target" in drift.replaces


def test_replacement_follows_a_worker_replaced_outside_pulumi():
    p = WorkerReplacementProvider()
    olds = {"cluster": "c", "worker_id": "w1", "old_worker_id": "w1", "new_worker_id": "w2", "kube_version": "1.37"}
    news = {"cluster": "c", "worker_id": "w1", "kube_version": "1.37"}
    assert not p.diff("w1", {**olds, "worker_state": "deployed"}, news).changes
    drift = p.diff("w1", {**olds, "worker_state": "deleted"}, news)
    assert drift.changes and not drift.replaces  # an update that follows the worker, never a second replace
