"""Both whole stacks under Pulumi mocks: what each stage declares, in what order, and that it validates."""
import copy

import pytest
from pulumi.runtime.rpc import _special_secret_sig as SECRET_SIG, _special_sig_key as SECRET_SIG_KEY

from harness import REPLACEMENT, kubernetes_validate, run_program, stack_config

from iks_gpu_migration.config import ConfigError

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
    # ibm-managed: the fence (refuses a replaced node, sets both runbook labels once), then operands=false declared.
    assert labels(run, IBM_NODE) == {"nvidia.com/gpu.deploy.operands": "false"}
    fence = run.named(f"{IBM_NODE}-fence").inputs
    assert fence["stage"] == "ibm-managed" and fence["labels"] == {
        "nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}
    assert run.depends(f"{IBM_NODE}-labels", f"{IBM_NODE}-fence")
    # Migrated nodes: the path switch owns their labels.
    assert not {f"{DP_NODE}-labels", f"{DRA_NODE}-labels"} & run.names()
    assert run.named(f"{DRA_NODE}-switch").inputs["target"] == "dra"
    assert run.named(f"{DP_NODE}-switch").inputs["target"] == "device-plugin"
    assert run.named(f"{DRA_NODE}-switch").inputs["device_plugin_resource"] == "nvidia.com/gpu"
    # Only nodes past ibm-managed are replaced; only dra nodes get a smoke test.
    assert {f"{DRA_NODE}-replacement", f"{DP_NODE}-replacement"} <= run.names()
    assert f"{IBM_NODE}-replacement" not in run.names()
    assert {f"smoke-{DRA_NODE}", f"{DRA_NODE}-smoke-verification"} <= run.names()
    assert not {f"smoke-{DP_NODE}", f"smoke-{IBM_NODE}"} & run.names()
    assert {"gpu-operator", "dra-driver", "device-class", f"{DRA_NODE}-dra-preflight", "smoke-namespace"} <= run.names()
    replacement = run.named(f"{DP_NODE}-replacement").inputs
    assert (replacement["worker_id"], replacement["kube_version"]) == ("kube-pilot0001-gpu-00000102", "1.37")
    # Siblings are no longer passed (O(n^2) inputs at fleet scale), nor the batch's entries (the provider reads
    # gpu-migration:nodes from its config): a resumed replacement relies on its state, the nodes' records and config.
    assert "other_worker_ids" not in replacement and "entries" not in replacement
    assert "single_gpu_node" not in replacement and "pool_rules" not in replacement  # at their defaults: not stored
    assert run.named(f"smoke-{DRA_NODE}").inputs["spec"]["nodeSelector"]["kubernetes.io/hostname"] == DRA_NODE
    # One preflight per batch with dra nodes, over that batch (kube/preflight.py preflight with the pilot label).
    preflight = run.named(f"{DRA_NODE}-dra-preflight").inputs
    assert preflight["dra_nodes"] == [DRA_NODE] and preflight["all_nodes"] == [DRA_NODE]
    assert preflight["pilot_label"] == "migration.example.com/gpu-dra=pilot"
    assert f"{DP_NODE}-dra-preflight" not in run.names()
    assert run.named("smoke-namespace").inputs["metadata"]["name"] == "gpu-pilot"


def test_device_plugin_resource_is_what_the_rollback_checks():
    run = run_program(pilot(**{DRA_NODE: "device-plugin"}))
    # The switch's readiness checks it is allocatable; its rollback check pod asks for it (kube/switch.py).
    assert run.named(f"{DP_NODE}-switch").inputs["device_plugin_resource"] == "nvidia.com/gpu"
    assert run.named(f"{DRA_NODE}-switch").inputs["check_image"]  # the rolled-back node has its check
    raw = pilot(**{DRA_NODE: "device-plugin"})
    raw["devicePluginResourceName"] = "nvidia.com/mig-1g.10gb"
    run = run_program(raw)
    assert run.named(f"{DP_NODE}-switch").inputs["device_plugin_resource"] == "nvidia.com/mig-1g.10gb"
    assert run.named(f"{DRA_NODE}-switch").inputs["device_plugin_resource"] == "nvidia.com/mig-1g.10gb"


def test_pilot_order(pilot_run):
    run = pilot_run
    # Master first; then one node at a time (maxUnavailable 1: one slot), in config order, each after its gate. The
    # next node's gate is registered only once a slot is free (rollout.py), not through a dependency edge.
    assert run.depends(f"{DRA_NODE}-replacement", "master-version")
    assert run.depends(f"{DRA_NODE}-replacement", f"{DRA_NODE}-gate")
    assert run.depends(f"{DP_NODE}-replacement", f"{DP_NODE}-gate")
    assert run.named(f"{DP_NODE}-gate").inputs["after"] == [DRA_NODE]
    order = [r.name for r in run.registered]
    assert order.index(f"{DRA_NODE}-switch") < order.index(f"{DP_NODE}-gate")
    # The rollback check, readiness, operand placement and pending GPU pods are steps of the node's switch
    # (kube/switch.py): five resources per device-plugin node (GpuNode, fence, its gate, replacement, switch).
    assert not {f"{DRA_NODE}-{c}" for c in ("rollback", "operator-ready", "pending-gpu-pods", "operand-placement")
                } & run.names()
    assert run.named(f"{DRA_NODE}-switch").inputs["operator_min_version"] == "1.36"
    assert [r.name for r in run.registered if r.name.startswith(DP_NODE)] == [
        DP_NODE, f"{DP_NODE}-fence", f"{DP_NODE}-gate", f"{DP_NODE}-replacement", f"{DP_NODE}-switch"]
    # The inventory precedes everything that changes a node; the operand placement check follows the operator.
    for name in ("gpu-operator", "master-version", "dra-driver", "device-class", f"{DRA_NODE}-replacement",
                 f"{DRA_NODE}-gate"):
        assert run.depends(name, "gpu-node-inventory")
    # ... and the inventory, like everything the stack declares, waits for the check that the kubeconfig's cluster is
    # clusterName (iks/identity.py).
    for resource in run.registered:
        if resource.name != "cluster-identity" and not resource.typ.startswith(("gpu-migration:index:", "pulumi:")):
            assert run.depends(resource.name, "cluster-identity"), resource.name
    assert run.depends("operand-placement", "gpu-operator")
    # The switch (ending with readiness) waits for the operator and its placement check through its namespace input,
    # without an edge (rollout.once_done; tests/test_node_identity.py checks a failed operator holds it back).
    assert order.index("operand-placement") < order.index(f"{DRA_NODE}-switch")
    assert not run.depends(f"{DRA_NODE}-switch", "gpu-operator")
    assert not run.depends(f"{DRA_NODE}-replacement", f"{DP_NODE}-switch")
    # The operator only arrives once every node on IBM's drivers is fenced off: ibm-managed ones by their labels,
    # the ones awaiting replacement by their fence (which also precedes their replacement).
    assert run.depends("gpu-operator", f"{IBM_NODE}-labels") and run.depends("gpu-operator", f"{IBM_NODE}-fence")
    for node in (DRA_NODE, DP_NODE):
        assert run.depends("gpu-operator", f"{node}-fence") and run.depends(f"{node}-replacement", f"{node}-fence")
        assert run.named(f"{node}-fence").inputs["node"] == node
    # DRA path: the driver and DeviceClass wait for the master (an older API server drops extendedResourceName);
    # switch, driver and DeviceClass are in place before the preflight, the smoke pod after it.
    assert run.depends("dra-driver", "master-version") and run.depends("device-class", "master-version")
    for dep in ("device-class", "dra-driver", f"{DRA_NODE}-switch"):
        assert run.depends(f"{DRA_NODE}-dra-preflight", dep)
    assert run.named(f"{DRA_NODE}-dra-preflight").inputs["device_class"] == "nvidia.com-gpu"
    assert run.depends(f"{DRA_NODE}-switch", f"{DRA_NODE}-replacement")
    assert run.named(f"{DRA_NODE}-switch").inputs["dra_namespace"] == "nvidia-dra-driver-gpu"
    assert run.depends(f"smoke-{DRA_NODE}", f"{DRA_NODE}-dra-preflight")
    assert run.depends(f"{DRA_NODE}-smoke-verification", f"smoke-{DRA_NODE}")
    # The next batch waits for the dra node's smoke verification too: it uncordons the node, which the next gate
    # would otherwise count as unavailable.
    assert order.index(f"{DRA_NODE}-smoke-verification") < order.index(f"{DP_NODE}-gate")
    assert run.named(f"{DRA_NODE}-smoke-verification").inputs["dra_namespace"] == "nvidia-dra-driver-gpu"
    # A device-plugin node's switch carries the rollback check; a dra node's does not.
    assert run.named(f"{DP_NODE}-switch").inputs["check_image"] and "check_image" not in run.named(
        f"{DRA_NODE}-switch").inputs


def test_pilot_manifests_pass_kubernetes_validate(pilot_run, tmp_path):
    manifests = pilot_run.kubernetes_manifests()
    assert {m["kind"] for m in manifests} == {"Node", "DeviceClass", "Namespace", "Pod"}
    device_class = next(m for m in manifests if m["kind"] == "DeviceClass")
    assert device_class["spec"]["selectors"] == [{"cel": {"expression":
        'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"'}}]
    result = kubernetes_validate(manifests, tmp_path)
    assert result.returncode == 0 and "WARN" not in result.stdout and "ERROR" not in result.stdout, result.stdout


def test_validation_catches_a_bad_manifest(pilot_run, tmp_path):
    device_class = copy.deepcopy(next(m for m in pilot_run.kubernetes_manifests() if m["kind"] == "DeviceClass"))
    device_class["spec"]["extendedResource"] = device_class["spec"].pop("extendedResourceName")
    result = kubernetes_validate([device_class], tmp_path)
    assert result.returncode != 0 and "extendedResource" in result.stdout


def test_prod_has_no_dra_yet(tmp_path):
    run = run_program(stack_config("prod"))
    assert not {"dra-driver", "device-class", f"{DRA_NODE}-dra-preflight", "smoke-namespace"} & run.names()
    assert [r.name for r in run.of_type(REPLACEMENT)] == ["10.241.0.21-replacement"]
    assert all(labels(run, n) == {"nvidia.com/gpu.deploy.operands": "false"}
               for n in ("10.241.0.22", "10.241.0.23", "10.241.0.24"))
    result = kubernetes_validate(run.kubernetes_manifests(), tmp_path)
    assert result.returncode == 0, result.stdout


def test_moving_a_node_to_dra_adds_labels_and_smoke_test():
    run = run_program(pilot(**{DP_NODE: "dra"}))
    assert run.named(f"{DP_NODE}-switch").inputs["target"] == "dra"
    assert {f"smoke-{DP_NODE}", f"{DP_NODE}-smoke-verification"} <= run.names()
    assert "check_image" not in run.named(f"{DP_NODE}-switch").inputs
    assert run.named(f"{DRA_NODE}-dra-preflight").inputs["dra_nodes"] == [DRA_NODE]
    assert run.named(f"{DP_NODE}-dra-preflight").inputs["dra_nodes"] == [DP_NODE]


def test_rollback_keeps_device_class_while_another_node_is_dra():
    run = run_program(pilot(**{DP_NODE: "dra", DRA_NODE: "device-plugin"}))
    assert {f"{DRA_NODE}-switch", "device-class"} <= run.names() and run.named(f"{DRA_NODE}-switch").inputs[
        "check_image"]
    assert f"smoke-{DRA_NODE}" not in run.names()
    assert run.named(f"{DRA_NODE}-switch").inputs["target"] == "device-plugin"


def test_last_dra_node_rolled_back_removes_dra_path():
    run = run_program(pilot(**{DRA_NODE: "device-plugin"}))
    assert run.named(f"{DRA_NODE}-switch").inputs["target"] == "device-plugin"
    assert not {"device-class", "dra-driver", f"{DRA_NODE}-dra-preflight"} & run.names()


def test_chart_25_12_class_is_used_instead_of_a_second_one():
    raw = pilot()
    raw["draDriver"]["version"] = "25.12.0"
    run = run_program(raw)
    assert "device-class" not in run.names()
    assert run.named(f"{DRA_NODE}-dra-preflight").inputs["device_class"] == "gpu.nvidia.com"
    raw["deviceSelectors"] = ["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"]
    with pytest.raises(Exception, match="already mapped by the DRA chart's DeviceClass gpu.nvidia.com"):
        run_program(raw)


def test_dra_chart_values_fail_preview():
    raw = pilot()
    raw["draDriver"]["values"].pop("gpuResourcesEnabledOverride")
    raw["draDriver"]["values"]["gpuResourcesEnabledOverride"] = False
    with pytest.raises(Exception, match="gpuResourcesEnabledOverride is not"):
        run_program(raw, preview=True)


def test_gpu_taints_are_tolerated_by_smoke_pod_rollback_pod_and_kubelet_plugin():
    raw = pilot(**{DP_NODE: "dra"})
    raw["nodes"][0]["stage"] = "device-plugin"
    raw["gpuTaints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    run = run_program(raw)
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert toleration in run.named(f"smoke-{DP_NODE}").inputs["spec"]["tolerations"]
    assert run.named(f"{DRA_NODE}-switch").inputs["check_tolerations"] == [toleration]
    assert run.named("dra-driver").inputs["values"]["kubeletPlugin"]["tolerations"] == [toleration]


def test_single_gpu_node_is_replaced_only_with_a_temp_pool():
    raw = pilot()
    raw["nodes"] = raw["nodes"][1:2]
    assert run_program(raw).named(f"{DP_NODE}-replacement").inputs["single_gpu_node"] is True
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4", "zone": "us-south-1", "vpcId": "r006-vpc",
                          "subnetId": "0717-subnet"}
    assert "single_gpu_node" not in run_program(raw).named(f"{DP_NODE}-replacement").inputs
    assert "single_gpu_node" not in run_program(pilot()).named(f"{DP_NODE}-replacement").inputs


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


def test_api_key_set_without_secret_is_refused_before_anything_is_declared():
    """`pulumi config set gpu-migration:ibmApiKey <key>` (no --secret) leaves the key readable in Pulumi.<stack>.yaml:
    the engine lists it among the config's non-secret keys, and `preview` stops naming the key and the command."""
    raw = {**stack_config("prod"), "ibmApiKey": "plain-key-1234"}
    with pytest.raises(ConfigError) as refused:
        run_program(raw)
    message = str(refused.value)
    assert "gpu-migration:ibmApiKey: is set in plain text" in message
    assert "`pulumi config set --secret gpu-migration:ibmApiKey <value>`" in message
    assert "plain-key-1234" not in message


def test_preview_declares_the_same_resources(pilot_run):
    assert run_program(stack_config("pilot"), preview=True).names() == pilot_run.names()


def test_the_helm_releases_use_their_own_kubeconfig_when_chart_kubeconfig_is_set(tmp_path):
    """gpu-migration:chartKubeconfig: the two releases go through the provider `charts` (the chart identity,
    rbac/gpu-migration-charts.yaml), everything else of the program through `cluster`; unset, the releases share
    `cluster` (docs/permissions.md)."""
    program, charts = tmp_path / "program.kubeconfig", tmp_path / "charts.kubeconfig"
    program.write_text("{}")
    charts.write_text("{}")
    raw = pilot(**{DP_NODE: "dra"})
    run = run_program({**raw, "kubeconfig": str(program), "chartKubeconfig": str(charts)})
    provider = {r.name: r for r in run.of_type("pulumi:providers:kubernetes")}
    assert provider["charts"].inputs["kubeconfig"] == str(charts)
    assert provider["cluster"].inputs["kubeconfig"] == str(program)
    assert run.providers["gpu-operator"] == run.providers["dra-driver"] == "charts"
    own = [r.name for r in run.registered if r.typ.startswith("kubernetes:") and not r.typ.startswith(
        "kubernetes:helm")]
    assert own and {run.providers[n] for n in own} == {"cluster"}, {n: run.providers[n] for n in own}
    shared = run_program({**raw, "kubeconfig": str(program)})
    assert shared.providers["gpu-operator"] == shared.providers["dra-driver"] == "cluster"
    assert "charts" not in {r.name for r in shared.of_type("pulumi:providers:kubernetes")}
