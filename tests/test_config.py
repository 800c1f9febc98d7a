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
    assert f"gpu-migration:nodes[2].name: duplicate node name {raw['nodes'][0]['name']!r} in nodes (also nodes[0])" \
        in error_for(raw)
    raw = stack_config("pilot")
    raw["nodes"][2]["workerId"] = raw["nodes"][0]["workerId"]
    assert f"gpu-migration:nodes[2].workerId: duplicate node workerId {raw['nodes'][0]['workerId']!r}" in error_for(raw)


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


@pytest.mark.parametrize("name", ["Node_1", "node-1\n"])
def test_invalid_node_name_is_named(raw, name):
    raw["nodes"][0]["name"] = name
    assert f"gpu-migration:nodes[0].name: node name {name!r} is not a valid" in error_for(raw)


def test_unknown_and_missing_keys(raw):
    raw["extendedResouceName"] = "example.com/gpu"
    del raw["clusterName"]
    message = error_for(raw)
    assert "gpu-migration:extendedResouceName: unknown key" in message
    assert "gpu-migration:clusterName: is required" in message


def test_stage_needs_kube_version(raw):
    raw["kubeVersion"] = "1.36"
    assert ("gpu-migration:nodes[0].stage: node '10.240.0.11' is at stage 'dra', which needs kubeVersion >= 1.37 "
            "(got '1.36')") in error_for(raw)


def test_temp_pool_needs_flavor_and_zone(raw):
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4"}
    message = error_for(raw)
    for key in ("zone", "vpcId", "subnetId"):
        assert f"gpu-migration:tempGpuPool.{key}: is required when tempGpuPool.enabled is true" in message
    assert "tempGpuPool.flavor" not in message


def test_bad_config_declares_nothing(raw):
    raw["nodes"][0]["stage"] = "bogus"
    with pytest.raises(ConfigError, match="bogus"):
        run_program(raw)


@pytest.mark.parametrize("version", ["^25.10", "~25", ">=25.10.1", "25.x", "*", "latest", "25.10", "25", "v25.10"])
def test_chart_version_must_be_pinned(raw, version):
    raw["gpuOperator"]["version"] = version
    message = error_for(raw)
    assert f"gpu-migration:gpuOperator.version: chart version {version!r} must be pinned" in message


# --- every problem at once, each under its own key -------------------------------------------------------------


def test_every_problem_is_reported_at_once(raw):
    """Field errors no longer hide the checks across fields, nor does one problem hide the next."""
    raw["clusterName"] = ""  # a field error
    raw["kubeVersion"] = "1.36"  # then: the dra node needs 1.37 ...
    raw["nodes"][2]["workerId"] = raw["nodes"][1]["workerId"]  # ... a duplicate worker ID ...
    raw["nodes"][1]["stage"] = "bogus"  # ... next to an invalid entry
    raw["tempGpuPool"] = {"enabled": True, "flavor": "f", "zone": "z", "vpcId": "v"}  # ... and an incomplete pool
    lines = error_for(raw).splitlines()[1:]
    assert [line.split(": ")[0].strip() for line in lines] == [
        "gpu-migration:clusterName",
        "gpu-migration:nodes[1].stage",
        "gpu-migration:nodes[0].stage",
        "gpu-migration:tempGpuPool.subnetId",
    ]
    raw["nodes"][1]["stage"] = "device-plugin"
    keys = [line.split(": ")[0].strip() for line in error_for(raw).splitlines()[1:]]
    assert "gpu-migration:nodes[2].workerId" in keys  # checked once nodes[1] is valid


def test_no_line_names_only_the_namespace(raw):
    raw["kubeVersion"] = "1.35"
    raw["tempGpuPool"] = {"enabled": True}
    for line in error_for(raw).splitlines()[1:]:
        assert not line.strip().startswith("gpu-migration: "), line


# --- values accepted before although wrong --------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("inf", "finite number (got 'inf')"),
    ("nan", "finite number"),
    (True, "a boolean (true) where a number belongs"),
    (10 ** 7, "is more than 7 days"),
    (0, "greater than 0"),
])
def test_bad_timeouts_are_named(raw, value, expected):
    raw["timeouts"] = {"drain": value}
    message = error_for(raw)
    assert "gpu-migration:timeouts.drain: " in message and expected in message


@pytest.mark.parametrize("value, expected", [
    (0.0001, "0.0001s is too small"),
    (False, "a boolean (false) where a number belongs"),
    (900, "is not below timeouts.drain (200s)"),  # the shortest timeout (pathSwitch defaults to 300)
])
def test_bad_poll_interval_is_named(raw, value, expected):
    raw["timeouts"] = {"pollInterval": value, "drain": 200}
    message = error_for(raw)
    assert "gpu-migration:timeouts.pollInterval: " in message and expected in message


def test_boolean_pool_size_is_rejected(raw):
    raw["tempGpuPool"] = {"sizePerZone": True}
    assert "gpu-migration:tempGpuPool.sizePerZone: a boolean (true) where a number belongs" in error_for(raw)


@pytest.mark.parametrize("key", ["gpuOperator", "draDriver"])
def test_invalid_chart_namespace(raw, key):
    raw[key]["namespace"] = "GPU_Operator"
    assert f"gpu-migration:{key}.namespace: namespace 'GPU_Operator' is not a DNS label" in error_for(raw)


def test_invalid_smoke_namespace(raw):
    raw["smokeTest"]["namespace"] = "a" * 64
    assert "gpu-migration:smokeTest.namespace: namespace 'aaaa" in error_for(raw)


def test_node_name_too_long_for_derived_names(raw):
    name = ".".join(["node"] * 13)  # 64 chars: a valid node name, but not a label value
    raw["nodes"][0]["name"] = name
    message = error_for(raw)
    assert f"gpu-migration:nodes[0].name: node name {name!r} is 64 chars" in message
    assert "kubernetes.io/hostname=<name>, a label value of at most 63" in message
    raw["nodes"][0]["name"] = name[:63].rstrip(".")
    parse(raw)


@pytest.mark.parametrize("worker_id", ["kube-abc 01", " kube-abc", "kube-äbc", "kube-abc\n"])
def test_worker_id_with_whitespace_or_non_ascii(raw, worker_id):
    raw["nodes"][1]["workerId"] = worker_id
    assert f"gpu-migration:nodes[1].workerId: worker ID {worker_id!r} must be ASCII" in error_for(raw)


@pytest.mark.parametrize("label, expected", [
    ("nvidia.com/gpu.deploy.dra=true", "collides with the GPU Operator's nvidia.com/gpu.deploy.* switches"),
    ("kubernetes.io/gpu-dra=pilot", "reserved prefix 'kubernetes.io'"),
    ("node.kubernetes.io/gpu-dra=pilot", "reserved prefix 'node.kubernetes.io'"),
    ("k8s.io/gpu-dra=pilot", "reserved prefix 'k8s.io'"),
    ("example.k8s.io/gpu-dra=pilot", "reserved prefix 'example.k8s.io'"),
])
def test_pilot_label_reserved(raw, label, expected):
    raw["pilotLabel"] = label
    message = error_for(raw)
    assert "gpu-migration:pilotLabel: " in message and expected in message


def test_pilot_label_other_domains_are_fine(raw):
    for label in ("nvidia.com/gpu-dra=pilot", "mykubernetes.io/x=y", "example.com/k8s.io=x"):
        raw["pilotLabel"] = label
        assert parse(raw).pilot_label == label


@pytest.mark.parametrize("key", ["endpoint", "iamEndpoint"])
@pytest.mark.parametrize("url", ["http://containers.cloud.ibm.com/global", "containers.cloud.ibm.com", "ftp://x",
                                 "https://"])
def test_endpoint_must_be_https(raw, key, url):
    raw["ibmCloud"] = {key: url}
    assert f"gpu-migration:ibmCloud.{key}: {url!r} is not an https:// URL" in error_for(raw)


def test_plain_http_only_to_a_local_emulator(raw):
    raw["ibmCloud"] = {"endpoint": "http://127.0.0.1:8080", "iamEndpoint": "http://localhost:9",
                       "allowCustomEndpoints": True}
    assert parse(raw).ibm_cloud.endpoint == "http://127.0.0.1:8080"


@pytest.mark.parametrize("endpoint,iam", [
    ("https://containers.cloud.ibm.com/global", "https://iam.cloud.ibm.com"),
    ("https://private.us-south.containers.cloud.ibm.com/global", "https://private.iam.cloud.ibm.com"),
    ("https://us-south.private.containers.cloud.ibm.com/global", "https://private.eu-de.iam.cloud.ibm.com"),
    ("https://eu-de.containers.cloud.ibm.com", "https://iam.cloud.ibm.com/"),
])
def test_ibm_cloud_hosts_public_and_private(raw, endpoint, iam):
    raw["ibmCloud"] = {"endpoint": endpoint, "iamEndpoint": iam}
    assert parse(raw).ibm_cloud.iam_endpoint == iam


@pytest.mark.parametrize("key,url,host", [
    ("endpoint", "https://containers.cloud.ibm.com.example.net/global", "containers.cloud.ibm.com.example.net"),
    ("endpoint", "https://evilcontainers.cloud.ibm.com/global", "evilcontainers.cloud.ibm.com"),
    ("iamEndpoint", "https://iam.attacker.example", "iam.attacker.example"),
    ("iamEndpoint", "http://127.0.0.1:8080", "127.0.0.1"),
    ("iamEndpoint", "https://containers.cloud.ibm.com", "containers.cloud.ibm.com"),  # the IKS host is no IAM host
])
def test_other_hosts_need_the_explicit_override(raw, key, url, host):
    """The key goes to iamEndpoint, IAM tokens to endpoint: one config line must not send them elsewhere."""
    raw["ibmCloud"] = {key: url}
    message = error_for(raw)
    assert f"gpu-migration:ibmCloud.{key}: host {host} is not an IBM Cloud" in message
    assert "set gpu-migration:ibmCloud.allowCustomEndpoints: true" in message
    assert message.count("\n") == 1  # one problem, one line
    raw["ibmCloud"]["allowCustomEndpoints"] = True
    assert getattr(parse(raw).ibm_cloud, "endpoint" if key == "endpoint" else "iam_endpoint") == url


def test_endpoint_with_credentials_is_refused(raw):
    raw["ibmCloud"] = {"endpoint": "https://user:pw@containers.cloud.ibm.com/global", "allowCustomEndpoints": True}
    assert "carries credentials (user:password@)" in error_for(raw)


def test_cel_selector_must_parse(raw):
    good = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
    raw["deviceSelectors"] = [good, "device.driver ==", "a &&& b"]
    message = error_for(raw)
    assert "gpu-migration:deviceSelectors: CEL selector does not parse: [1] 'device.driver =='" in message
    assert "[2] 'a &&& b'" in message and "[0]" not in message
    raw["deviceSelectors"] = [good]
    assert parse(raw).device_selectors == [good]


def test_kubeconfig_must_exist(raw, tmp_path):
    raw["kubeconfig"] = str(tmp_path / "missing")
    assert f"gpu-migration:kubeconfig: kubeconfig file {raw['kubeconfig']!r} does not exist" in error_for(raw)
    (tmp_path / "missing").write_text("apiVersion: v1\n")
    assert parse(raw).kubeconfig == raw["kubeconfig"]


def test_hooks(raw):
    raw["hooks"] = {"beforeReplace": "./move-workloads.sh", "afterVerification": "echo done"}
    cfg = parse(raw)
    assert (cfg.hooks.before_replace, cfg.hooks.after_verification) == ("./move-workloads.sh", "echo done")
    raw["hooks"] = {"beforeReplace": " ", "afterVerfication": "x"}
    message = error_for(raw)
    assert "gpu-migration:hooks.beforeReplace: is empty" in message
    assert "gpu-migration:hooks.afterVerfication: unknown key" in message


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


def test_every_default_timeout_is_above_the_default_poll_interval():
    """A timeout added later (e.g. pathSwitch) must not make the default config fail the poll-interval check."""
    from iks_gpu_migration.config import Timeouts
    t = Timeouts()
    for name in Timeouts.model_fields:
        if name != "poll_interval":
            assert getattr(t, name) > t.poll_interval, name


def test_drain_options_parse_with_kubectl_defaults(raw):
    cfg = parse(raw)
    assert (cfg.drain.force, cfg.drain.delete_empty_dir_data, cfg.drain.skip_wait_for_delete_timeout,
            cfg.drain.gpu_pods_only, cfg.drain.wait_for_completion) == (False, False, 0, False, None)
    raw["drain"] = {"force": True, "deleteEmptyDirData": True, "skipWaitForDeleteTimeout": 300, "gpuPodsOnly": True,
                    "waitForCompletion": {"podSelector": "app=train,team=ml"}}
    cfg = parse(raw)
    assert cfg.drain.force and cfg.drain.wait_for_completion.timeout == 3600
    assert cfg.drain.model_dump()["wait_for_completion"] == {"pod_selector": "app=train,team=ml", "timeout": 3600}


@pytest.mark.parametrize("drain, key, expected", [
    ({"force": "yes please"}, "drain.force", "valid boolean"),
    ({"skipWaitForDeleteTimeout": -1}, "drain.skipWaitForDeleteTimeout", "greater than or equal to 0"),
    ({"waitForCompletion": {"podSelector": "app"}}, "drain.waitForCompletion.podSelector", "'app' must be key=value"),
    ({"waitForCompletion": {}}, "drain.waitForCompletion.podSelector", "is required"),
    ({"deleteEmptydirData": True}, "drain.deleteEmptydirData", "unknown key (got True)"),
])
def test_bad_drain_options_are_named(raw, drain, key, expected):
    raw["drain"] = drain
    message = error_for(raw)
    assert f"gpu-migration:{key}: " in message and expected in message, message


def test_worker_pool_rules_opt_outs(raw):
    assert parse(raw).worker_pool_rules.props() == {}  # nothing to store per node without opt-outs
    raw["workerPoolRules"] = {"allowRebalancingOff": ["gpu-a"]}
    assert parse(raw).worker_pool_rules.props() == {"allow_rebalancing_off": ["gpu-a"]}
    raw["workerPoolRules"] = {"allowRebalancingOff": ["gpu-a"], "allowAutoscaling": ["gpu-b"]}
    assert parse(raw).worker_pool_rules.props() == {"allow_rebalancing_off": ["gpu-a"], "allow_autoscaling": ["gpu-b"]}
    raw["workerPoolRules"] = {"allowAutoscaling": [" "], "allowRebalance": ["gpu-a"]}
    message = error_for(raw)
    assert "gpu-migration:workerPoolRules.allowAutoscaling: entry 0 is empty" in message
    assert "workerPoolRules.allowRebalance" in message


def test_chart_kubeconfig_must_exist_like_kubeconfig(raw, tmp_path):
    raw["chartKubeconfig"] = str(tmp_path / "charts.kubeconfig")
    assert (f"gpu-migration:chartKubeconfig: kubeconfig file {raw['chartKubeconfig']!r} does not exist"
            in error_for(raw))
    (tmp_path / "charts.kubeconfig").write_text("{}")
    assert parse(raw).chart_kubeconfig == raw["chartKubeconfig"]
    del raw["chartKubeconfig"]
    assert parse(raw).chart_kubeconfig is None


def test_an_unknown_key_close_to_a_known_one_gets_a_did_you_mean(raw):
    raw["maxUnavaliable"] = 2
    raw["timeouts"] = {"drian": 5}
    raw["nodes"][0]["wokerId"] = raw["nodes"][0].pop("workerId")
    raw["someOtherThing"] = 1
    message = error_for(raw)
    assert "gpu-migration:maxUnavaliable: unknown key (got '2'); did you mean maxUnavailable?" in message or \
        "gpu-migration:maxUnavaliable: unknown key (got 2); did you mean maxUnavailable?" in message, message
    assert "gpu-migration:timeouts.drian: unknown key (got 5); did you mean drain?" in message
    assert "gpu-migration:nodes[0].wokerId: unknown key" in message and "did you mean workerId?" in message
    assert "gpu-migration:someOtherThing: unknown key (got 1)\n" in message + "\n"  # nothing close: no guess
