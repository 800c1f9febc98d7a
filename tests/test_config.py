"""Config validation: every bad value is named before any resource is declared."""
import copy

import pytest

from iks_gpu_migration.config import ConfigError, parse
from harness import run_program, stack_config


@pytest.fixture
def raw():
    return copy.deepcopy(stack_config("pilot"))


def error_for(raw) -> str:
    with pytest.raises(ConfigError) as e:
        parse(raw)
    return str(e.value)


def test_pilot_and_prod_stacks_parse():
    for stack in ("pilot", "prod"):
        cfg = parse(stack_config(stack))
        # One name on both paths: existing pods keep requesting nvidia.com/gpu.
        assert cfg.nodes and cfg.extended_resource_name == "nvidia.com/gpu" == cfg.device_plugin_resource
        assert cfg.one_name_on_both_paths


def test_defaults(raw):
    for key in ("extendedResourceName", "devicePluginResourceName", "draDriverName", "pilotLabel"):
        raw.pop(key, None)
    raw["smokeTest"] = {"image": "cuda"}
    cfg = parse(raw)
    assert cfg.extended_resource_name == "nvidia.com/gpu" == cfg.device_plugin_resource
    assert cfg.dra_driver_name == "gpu.nvidia.com"
    assert cfg.gpu_taints == [] and cfg.pending_gpu_pods_gate is False and cfg.timeouts.path_switch == 300
    assert cfg.pilot_label_pair == ("migration.example.com/gpu-dra", "pilot")
    assert cfg.smoke_test.namespace == "gpu-pilot"


def test_unknown_stage_is_named(raw):
    raw["nodes"][1]["stage"] = "dra-pilot"
    assert "gpu-migration:nodes[1].stage: 'dra-pilot' is not one of ibm-managed, device-plugin, dra" in error_for(raw)


def test_duplicate_node_name_and_worker(raw):
    raw["nodes"][2]["name"] = raw["nodes"][0]["name"]
    assert f"duplicate node name {raw['nodes'][0]['name']!r}" in error_for(raw)
    raw = stack_config("pilot")
    raw["nodes"][2]["workerId"] = raw["nodes"][0]["workerId"]
    assert f"duplicate node workerId {raw['nodes'][0]['workerId']!r}" in error_for(raw)


@pytest.mark.parametrize("bad, expected", [
    ("gpu", "'gpu' needs a domain prefix"),
    ("example.com/gpu/x", "not a DNS subdomain"),
    ("Example_Com/gpu", "not a DNS subdomain"),
    ("example.com/-gpu", "name '-gpu' must be"),
    ("kubernetes.io/gpu", "reserved namespace"),
    ("nvidia.kubernetes.io/gpu", "reserved namespace"),
])
@pytest.mark.parametrize("key", ["extendedResourceName", "devicePluginResourceName"])
def test_invalid_extended_resource_name(raw, bad, expected, key):
    raw[key] = bad
    message = error_for(raw)
    assert f"gpu-migration:{key}" in message and expected in message


@pytest.mark.parametrize("key, bad, expected", [
    ("pilotLabel", "pilot", "must be key=value"),
    ("pilotLabel", "a/b=not valid", "is not a valid label value"),
    ("draDriverName", "GPU.Example.com", "lowercase DNS subdomain"),
    ("kubeVersion", "latest", "is not like 1.36"),
    ("clusterName", "", "at least 1 character"),
])
def test_invalid_scalars_are_named(raw, key, bad, expected):
    raw[key] = bad
    message = error_for(raw)
    assert f"gpu-migration:{key}" in message and expected in message


def test_invalid_node_name_is_named(raw):
    raw["nodes"][0]["name"] = "Node_1"
    assert "gpu-migration:nodes[0].name: node name 'Node_1' is not a valid" in error_for(raw)


def test_unknown_and_missing_keys(raw):
    raw["extendedResouceName"] = "example.com/gpu"
    del raw["clusterName"]
    message = error_for(raw)
    assert "gpu-migration:extendedResouceName: unknown key" in message
    assert "gpu-migration:clusterName: is required" in message


def test_stage_needs_kube_version(raw):
    raw["kubeVersion"] = "1.36"
    assert "stage 'dra', which needs kubeVersion >= 1.37 (got '1.36')" in error_for(raw)


def test_temp_pool_needs_flavor_and_zone(raw):
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4"}
    assert "tempGpuPool.enabled is true but zone, vpcId, subnetId is empty" in error_for(raw)


def test_bad_config_declares_nothing(raw):
    raw["nodes"][0]["stage"] = "bogus"
    with pytest.raises(ConfigError, match="bogus"):
        run_program(raw)


@pytest.mark.parametrize("version", ["^25.10", "~25", ">=25.10.1", "25.x", "*", "latest"])
def test_chart_version_must_be_pinned(raw, version):
    raw["gpuOperator"]["version"] = version
    message = error_for(raw)
    assert f"gpu-migration:gpuOperator.version: chart version {version!r} must be pinned" in message


def test_device_plugin_resource_must_be_under_nvidia_com(raw):
    raw["devicePluginResourceName"] = "example.com/gpu"
    assert ("gpu-migration:devicePluginResourceName: 'example.com/gpu': the NVIDIA device plugin only advertises "
            "names under nvidia.com/") in error_for(raw)
    raw["devicePluginResourceName"] = "nvidia.com/mig-1g.10gb"
    assert parse(raw).device_plugin_resource == "nvidia.com/mig-1g.10gb"


def test_distinct_names_are_allowed_but_not_one_name(raw):
    raw["extendedResourceName"] = "example.com/gpu"
    assert not parse(raw).one_name_on_both_paths


def test_gpu_taints_become_tolerations(raw):
    raw["gpuTaints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                        {"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]
    assert parse(raw).tolerations == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}]
    raw["gpuTaints"] = [{"key": "bad key!", "effect": "Sometimes"}]
    message = error_for(raw)
    assert "gpu-migration:gpuTaints[0].key" in message and "gpu-migration:gpuTaints[0].effect" in message
