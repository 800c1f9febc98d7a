"""Each Kubernetes component alone, under Pulumi mocks."""
import pytest

from iks_gpu_migration.components import charts
from iks_gpu_migration.components import dra_path as dra
from iks_gpu_migration.kube import labels as node_labels
from iks_gpu_migration.components import smoke_pod as smoke_test
from iks_gpu_migration.config import ConfigError, HelmChart, SmokeTest
from harness import registered_by

PILOT = ("migration.example.com/gpu-dra", "pilot")


@pytest.mark.parametrize("stage, expected", [
    # deploy.driver=false is set once by the NodeFence: the operator deletes it (removeAllGPUStateLabels), so a
    # declared one would come back as a diff after every `pulumi refresh`.
    ("ibm-managed", {"nvidia.com/gpu.deploy.operands": "false"}),
    ("dra", {}),  # NodePathSwitch owns the pilot and device-plugin labels
    ("device-plugin", {}),
])
def test_stage_labels(stage, expected):
    assert node_labels.stage_labels(stage, PILOT) == expected
    with pytest.raises(ValueError, match="unknown stage 'x'"):
        node_labels.stage_labels("x", PILOT)
    assert node_labels.IBM_MANAGED_LABELS == {"nvidia.com/gpu.deploy.operands": "false",
                                              "nvidia.com/gpu.deploy.driver": "false"}


def test_node_patch_renders_labels_and_forces_ownership():
    registered = registered_by(
        lambda: node_labels.node_patch("n1-labels", "10.0.0.1", node_labels.stage_labels("ibm-managed", PILOT)))
    (patch,) = registered
    assert patch.typ == "kubernetes:core/v1:NodePatch"
    assert patch.inputs["metadata"]["name"] == "10.0.0.1"
    assert patch.inputs["metadata"]["labels"] == {"nvidia.com/gpu.deploy.operands": "false"}
    assert patch.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"


def chart(**overrides) -> HelmChart:
    base = dict(chart="gpu-operator", repo="https://helm.ngc.nvidia.com/nvidia", version="v25.10.1",
                namespace="gpu-operator", values={"driver": {"enabled": True}})
    return HelmChart(**{**base, **overrides})


def test_gpu_operator_release_is_pinned():
    registered = registered_by(lambda: charts.gpu_operator_release(chart()))
    (release,) = registered
    assert release.typ == "kubernetes:helm.sh/v3:Release"
    assert release.inputs["chart"] == "gpu-operator"
    assert release.inputs["version"] == "v25.10.1"
    assert release.inputs["namespace"] == "gpu-operator"
    assert release.inputs["repositoryOpts"]["repo"] == "https://helm.ngc.nvidia.com/nvidia"
    assert release.inputs["values"]["driver"] == {"enabled": True}
    assert release.inputs["atomic"] is True


def test_gpu_operator_controllers_prefer_workers_the_migration_never_drains():
    """The operator and NFD's master and gc prefer workers without IKS's GPU label (a drain of theirs restarts them
    and holds back new nodes' labels by a leader-Lease wait), keep the chart's control-plane preference, and a
    stack's own affinity wins."""
    from iks_gpu_migration.plan.gates import IKS_GPU_LABEL

    (release,) = registered_by(lambda: charts.gpu_operator_release(chart()))
    values = release.inputs["values"]
    nfd = values["node-feature-discovery"]
    for affinity in (values["operator"]["affinity"], nfd["master"]["affinity"], nfd["gc"]["affinity"]):
        terms = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert terms[0] == {"weight": 100, "preference": {"matchExpressions": [
            {"key": IKS_GPU_LABEL, "operator": "DoesNotExist"}]}}
        assert [t["preference"]["matchExpressions"][0]["key"] for t in terms[1:]] == [
            "node-role.kubernetes.io/master", "node-role.kubernetes.io/control-plane"]
    assert "affinity" not in nfd.get("worker", {})  # NFD's worker runs on every node, GPU workers first
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infra"]}]}]}}}
    (release,) = registered_by(lambda: charts.gpu_operator_release(chart(values={"operator": {"affinity": own}})))
    assert release.inputs["values"]["operator"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] \
        == own["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


DRA_CHART = dict(chart="nvidia-dra-driver-gpu", version="25.8.1", namespace="nvidia-dra-driver-gpu")


def test_dra_driver_kubelet_plugin_only_on_pilot_nodes():
    values = {"kubeletPlugin": {"nodeSelector": {"other": "x"}, "priorityClassName": "p"}, "resources": {"gpus": {"enabled": True}}}
    taint = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    registered = registered_by(lambda: charts.dra_driver_release(chart(**DRA_CHART, values=values), PILOT,
                                                                 tolerations=[taint]))
    (release,) = registered
    plugin = release.inputs["values"]["kubeletPlugin"]
    assert plugin["nodeSelector"] == {"other": "x", "migration.example.com/gpu-dra": "pilot"}
    assert plugin["priorityClassName"] == "p" and plugin["tolerations"] == [taint]
    # Defaults the chart needs on IKS: GPUs with the override, no ComputeDomain controller.
    assert release.inputs["values"]["gpuResourcesEnabledOverride"] is True
    assert release.inputs["values"]["resources"] == {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}}
    assert values["kubeletPlugin"]["nodeSelector"] == {"other": "x"}  # the config's values are not mutated


@pytest.mark.parametrize("values, problem", [
    ({"gpuResourcesEnabledOverride": False}, "gpuResourcesEnabledOverride is not: the chart's "
                                             "templates/validation.yaml refuses to install"),
    ({"resources": {"computeDomains": {"enabled": True}}}, "ComputeDomain controller needs a "
                                                           "node-role.kubernetes.io/control-plane node"),
    ({"resources": {"gpus": {"enabled": False}}}, "resources.gpus.enabled is not true"),
])
def test_dra_driver_values_the_chart_would_refuse_fail_at_preview(values, problem):
    with pytest.raises(ConfigError) as e:
        charts.dra_driver_release(chart(**DRA_CHART, values=values), PILOT)
    assert "gpu-migration:draDriver.values: " in str(e.value) and problem in str(e.value)


def test_user_values_may_override_compute_domain_affinity():
    values = {"resources": {"computeDomains": {"enabled": True}},
              "controller": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [{"matchExpressions": [{"key": "infra", "operator": "Exists"}]}]}}}}}
    assert charts.dra_values_problems(charts.dra_values(chart(**DRA_CHART, values=values), PILOT, [])) == []


def test_chart_class_of_25_12_maps_nvidia_gpu():
    v = lambda version: charts.chart_class_maps(chart(**{**DRA_CHART, "version": version}), {})
    assert (v("25.8.1"), v("25.12.0"), v("v26.1.0")) == (None, "nvidia.com/gpu", "nvidia.com/gpu")
    # Same selector as ours: use the chart's class; otherwise two classes would race for the name.
    assert dra.own_class_needed("nvidia.com/gpu", "gpu.nvidia.com", [], "nvidia.com/gpu") is False
    assert dra.own_class_needed("example.com/gpu", "gpu.nvidia.com", [], "nvidia.com/gpu") is True
    assert dra.own_class_needed("nvidia.com/gpu", "gpu.nvidia.com", [], None) is True
    with pytest.raises(ConfigError, match="already mapped by the DRA chart's DeviceClass gpu.nvidia.com"):
        dra.own_class_needed("nvidia.com/gpu", "gpu.nvidia.com", ["device.capacity['x'].memory > 1"], "nvidia.com/gpu")


def test_oci_chart_has_no_repository():
    registered = registered_by(lambda: charts.helm_release("x", chart(chart="oci://r.example/charts/x", repo=""), {}))
    assert "repositoryOpts" not in registered[0].inputs or not registered[0].inputs["repositoryOpts"]


def test_device_class():
    registered = registered_by(lambda: dra.device_class(
        "example.com/gpu", "gpu.example.com", ["device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0"]))
    (dc,) = registered
    assert dc.inputs["apiVersion"] == "resource.k8s.io/v1" and dc.inputs["kind"] == "DeviceClass"
    assert dc.inputs["metadata"]["name"] == "example.com-gpu"
    assert dc.inputs["spec"]["extendedResourceName"] == "example.com/gpu"
    assert [s["cel"]["expression"] for s in dc.inputs["spec"]["selectors"]] == [
        'device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].type == "gpu"',
        "device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0",
    ]


def test_smoke_pod():
    smoke = SmokeTest(image="cuda:12")
    registered = registered_by(lambda: smoke_test.smoke_pod("10.0.0.1", "10.0.0.1", smoke, "example.com/gpu", PILOT))
    (pod,) = registered
    spec = pod.inputs["spec"]
    assert pod.inputs["metadata"]["name"] == "gpu-smoke-test-10.0.0.1"
    assert pod.inputs["metadata"]["namespace"] == "gpu-pilot"
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "10.0.0.1", "migration.example.com/gpu-dra": "pilot"}
    # The node stays cordoned until the smoke test passed.
    assert spec["tolerations"] == [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    resources = spec["containers"][0]["resources"]
    assert resources["requests"] == {"example.com/gpu": "1"} == resources["limits"]


def test_deep_merge():
    assert charts.deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": 4}) == {"a": {"b": 1, "c": 3}, "d": 4}
