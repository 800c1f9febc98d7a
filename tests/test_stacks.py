"""Both whole stacks under Pulumi mocks: what each stage declares, in what order, and that it validates."""
import copy

import pytest
from pulumi.runtime.rpc import _special_secret_sig as SECRET_SIG, _special_sig_key as SECRET_SIG_KEY

from harness import REPLACEMENT, kubernetes_validate, run_program, stack_config

DRA_NODE, DP_NODE, IBM_NODE = "10.240.0.11", "10.240.0.12", "10.240.0.13"
PILOT_LABEL = "migration.example.com/gpu-dra"


def pilot(**stages):
    raw = copy.deepcopy(stack_config("pilot"))
    for node in raw["nodes"]:
        node["stage"] = stages.get(node["name"], node["stage"])
    return raw


@pytest.fixture(scope="module")
def pilot_run():
    return run_program(stack_config("pilot"))


def labels(run, node):
    return run.named(f"{node}-labels").inputs["metadata"]["labels"]


def test_pilot_declares_each_stage(pilot_run):
    run = pilot_run
    assert labels(run, IBM_NODE) == {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}
    assert labels(run, DP_NODE) == {}
    assert labels(run, DRA_NODE) == {PILOT_LABEL: "pilot", "nvidia.com/gpu.deploy.device-plugin": "false"}
    # Only nodes past ibm-managed are replaced; only dra nodes get a smoke test.
    assert {f"{DRA_NODE}-replacement", f"{DP_NODE}-replacement"} <= run.names()
    assert f"{IBM_NODE}-replacement" not in run.names()
    assert {f"smoke-{DRA_NODE}", f"{DRA_NODE}-smoke-verification"} <= run.names()
    assert not {f"smoke-{DP_NODE}", f"smoke-{IBM_NODE}"} & run.names()
    assert {"gpu-operator", "dra-driver", "device-class", "dra-preflight", "smoke-namespace"} <= run.names()
    replacement = run.named(f"{DP_NODE}-replacement").inputs
    assert (replacement["worker_id"], replacement["kube_version"]) == ("kube-pilot0001-gpu-00000102", "1.37")
    # Siblings are no longer passed (O(n^2) inputs at fleet scale); a resumed replacement relies on its own state.
    assert replacement["other_worker_ids"] == []
    assert run.named(f"smoke-{DRA_NODE}").inputs["spec"]["nodeSelector"]["kubernetes.io/hostname"] == DRA_NODE
    preflight = run.named("dra-preflight").inputs
    assert preflight["dra_nodes"] == [DRA_NODE]
    assert sorted(preflight["all_nodes"]) == sorted([DRA_NODE, DP_NODE, IBM_NODE])
    assert run.named("smoke-namespace").inputs["metadata"]["name"] == "gpu-pilot"


def test_device_plugin_resource_defaults_to_the_extended_resource():
    run = run_program(pilot(**{DRA_NODE: "device-plugin"}))
    assert run.named(f"{DP_NODE}-operator-ready").inputs["device_plugin_resource"] == "example.com/gpu"
    assert run.named(f"{DRA_NODE}-rollback").inputs["extended_resource"] == "example.com/gpu"
    raw = pilot(**{DRA_NODE: "device-plugin"})
    raw["devicePluginResourceName"] = "nvidia.com/gpu"
    run = run_program(raw)
    assert run.named(f"{DP_NODE}-operator-ready").inputs["device_plugin_resource"] == "nvidia.com/gpu"
    assert run.named(f"{DRA_NODE}-rollback").inputs["extended_resource"] == "nvidia.com/gpu"


def test_pilot_order(pilot_run):
    run = pilot_run
    # Master first; then one node at a time (maxUnavailable 1), in config order, each batch after its gate. The next
    # batch's gate is registered only once the previous batch is done (rollout.py), not through a dependency edge.
    assert run.depends(f"{DRA_NODE}-replacement", "master-version")
    assert run.depends(f"{DRA_NODE}-replacement", "batch-1-gate") and run.depends(f"{DP_NODE}-replacement", "batch-2-gate")
    assert run.named("batch-2-gate").inputs["after"] == [DRA_NODE]
    order = [r.name for r in run.registered]
    assert order.index(f"{DRA_NODE}-operator-ready") < order.index("batch-2-gate")
    assert not run.depends(f"{DRA_NODE}-replacement", f"{DP_NODE}-operator-ready")
    assert run.depends(f"{DRA_NODE}-operator-ready", f"{DRA_NODE}-replacement")
    # The operator only arrives once every node on IBM's drivers is fenced off: ibm-managed ones by their labels,
    # the ones awaiting replacement by their fence (which also precedes their replacement).
    assert run.depends("gpu-operator", f"{IBM_NODE}-labels")
    for node in (DRA_NODE, DP_NODE):
        assert run.depends("gpu-operator", f"{node}-fence") and run.depends(f"{node}-replacement", f"{node}-fence")
        assert run.named(f"{node}-fence").inputs["node"] == node
    assert f"{IBM_NODE}-fence" not in run.names()
    # DRA path: labels, driver and DeviceClass are in place before the preflight, the smoke pod after it.
    for dep in ("device-class", "dra-driver", f"{DRA_NODE}-labels"):
        assert run.depends("dra-preflight", dep)
    assert run.depends(f"smoke-{DRA_NODE}", "dra-preflight")
    assert run.depends(f"{DRA_NODE}-smoke-verification", f"smoke-{DRA_NODE}")
    # Rollback path of a device-plugin node: drain, then labels, then verification.
    assert run.depends(f"{DP_NODE}-labels", f"{DP_NODE}-drain")
    assert run.depends(f"{DP_NODE}-rollback", f"{DP_NODE}-labels")


def test_pilot_manifests_pass_kubernetes_validate(pilot_run, tmp_path):
    manifests = pilot_run.kubernetes_manifests()
    assert {m["kind"] for m in manifests} == {"Node", "DeviceClass", "Namespace", "Pod"}
    result = kubernetes_validate(manifests, tmp_path)
    assert result.returncode == 0 and "WARN" not in result.stdout and "ERROR" not in result.stdout, result.stdout


def test_validation_catches_a_bad_manifest(pilot_run, tmp_path):
    device_class = copy.deepcopy(next(m for m in pilot_run.kubernetes_manifests() if m["kind"] == "DeviceClass"))
    device_class["spec"]["extendedResource"] = device_class["spec"].pop("extendedResourceName")
    result = kubernetes_validate([device_class], tmp_path)
    assert result.returncode != 0 and "extendedResource" in result.stdout


def test_prod_has_no_dra_yet(tmp_path):
    run = run_program(stack_config("prod"))
    assert not {"dra-driver", "device-class", "dra-preflight", "smoke-namespace"} & run.names()
    assert [r.name for r in run.of_type(REPLACEMENT)] == ["10.241.0.21-replacement"]
    assert all(labels(run, n) == {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}
               for n in ("10.241.0.22", "10.241.0.23", "10.241.0.24"))
    result = kubernetes_validate(run.kubernetes_manifests(), tmp_path)
    assert result.returncode == 0, result.stdout


def test_moving_a_node_to_dra_adds_labels_and_smoke_test():
    run = run_program(pilot(**{DP_NODE: "dra"}))
    assert labels(run, DP_NODE) == {PILOT_LABEL: "pilot", "nvidia.com/gpu.deploy.device-plugin": "false"}
    assert {f"smoke-{DP_NODE}", f"{DP_NODE}-smoke-verification"} <= run.names()
    assert f"{DP_NODE}-drain" not in run.names()
    assert sorted(run.named("dra-preflight").inputs["dra_nodes"]) == sorted([DRA_NODE, DP_NODE])


def test_rollback_keeps_device_class_while_another_node_is_dra():
    run = run_program(pilot(**{DP_NODE: "dra", DRA_NODE: "device-plugin"}))
    assert {f"{DRA_NODE}-drain", f"{DRA_NODE}-rollback", "device-class"} <= run.names()
    assert f"smoke-{DRA_NODE}" not in run.names() and labels(run, DRA_NODE) == {}


def test_last_dra_node_rolled_back_removes_dra_path():
    run = run_program(pilot(**{DRA_NODE: "device-plugin"}))
    assert {f"{DRA_NODE}-drain", f"{DRA_NODE}-rollback"} <= run.names()
    assert not {"device-class", "dra-driver", "dra-preflight"} & run.names()


def test_single_gpu_node_is_replaced_only_with_a_temp_pool():
    raw = pilot()
    raw["nodes"] = raw["nodes"][1:2]
    assert run_program(raw).named(f"{DP_NODE}-replacement").inputs["single_gpu_node"] is True
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4", "zone": "us-south-1", "vpcId": "r006-vpc",
                          "subnetId": "0717-subnet"}
    assert run_program(raw).named(f"{DP_NODE}-replacement").inputs["single_gpu_node"] is False
    assert run_program(pilot()).named(f"{DP_NODE}-replacement").inputs["single_gpu_node"] is False


def test_temp_pool_comes_before_replacements():
    raw = pilot()
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4", "zone": "us-south-1", "vpcId": "r006-vpc",
                          "subnetId": "0717-subnet"}
    run = run_program(raw)
    pool = run.named("temp-gpu-pool").inputs
    assert (pool["flavor"], pool["zone"]) == ("gx3.16x80.l4", "us-south-1")
    assert run.depends(f"{DRA_NODE}-replacement", "temp-gpu-pool")
    assert run.depends("temp-gpu-pool", "master-version")


def test_api_key_comes_from_secret_config():
    run = run_program(stack_config("prod"), secrets={"ibmApiKey": "secret-key"})
    for name in ("master-version", "10.241.0.21-replacement"):
        api = run.named(name).inputs["api"]
        # The whole `api` input travels as a Pulumi secret, so state stores the key encrypted.
        assert api[SECRET_SIG_KEY] == SECRET_SIG and api["value"]["api_key"] == "secret-key"


def test_preview_declares_the_same_resources(pilot_run):
    assert run_program(stack_config("pilot"), preview=True).names() == pilot_run.names()
