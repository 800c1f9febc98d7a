"""Each Kubernetes component alone, under Pulumi mocks."""
import pytest

from iks_gpu_migration import charts, dra, node_labels, smoke_test
from iks_gpu_migration.config import HelmChart, SmokeTest
from harness import registered_by

PILOT = ("migration.example.com/gpu-dra", "pilot")


@pytest.mark.parametrize("stage, expected", [
    ("ibm-managed", {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"}),
    ("dra", {"migration.example.com/gpu-dra": "pilot", "nvidia.com/gpu.deploy.device-plugin": "false"}),
    ("device-plugin", {}),
])
def test_stage_labels(stage, expected):
    assert node_labels.stage_labels(stage, PILOT) == expected


def test_dra_node_never_keeps_device_plugin():
    labels = node_labels.stage_labels("dra", PILOT)
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
    with pytest.raises(ValueError, match="unknown stage 'x'"):
        node_labels.stage_labels("x", PILOT)


def test_node_patch_renders_labels_and_forces_ownership():
    registered = registered_by(
        lambda: node_labels.node_patch("n1-labels", "10.0.0.1", node_labels.stage_labels("dra", PILOT)))
    (patch,) = registered
    assert patch.typ == "kubernetes:core/v1:NodePatch"
    assert patch.inputs["metadata"]["name"] == "10.0.0.1"
    assert patch.inputs["metadata"]["labels"]["migration.example.com/gpu-dra"] == "pilot"
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
    assert release.inputs["values"] == {"driver": {"enabled": True}}
    assert release.inputs["atomic"] is True


def test_dra_driver_kubelet_plugin_only_on_pilot_nodes():
    values = {"kubeletPlugin": {"nodeSelector": {"other": "x"}, "priorityClassName": "p"}, "resources": {"gpus": {"enabled": True}}}
    registered = registered_by(lambda: charts.dra_driver_release(
        chart(chart="nvidia-dra-driver-gpu", version="25.8.1", namespace="nvidia-dra-driver-gpu", values=values), PILOT))
    (release,) = registered
    plugin = release.inputs["values"]["kubeletPlugin"]
    assert plugin["nodeSelector"] == {"other": "x", "migration.example.com/gpu-dra": "pilot"}
    assert plugin["priorityClassName"] == "p" and release.inputs["values"]["resources"] == {"gpus": {"enabled": True}}
    assert values["kubeletPlugin"]["nodeSelector"] == {"other": "x"}  # the config's values are not mutated


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
        'device.driver == "gpu.example.com"',
        "device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0",
    ]


def test_smoke_pod():
    smoke = SmokeTest(image="cuda:12")
    registered = registered_by(lambda: smoke_test.smoke_pod("10.0.0.1", "10.0.0.1", smoke, "example.com/gpu", PILOT))
    (pod,) = registered
    spec = pod.inputs["spec"]
    assert pod.inputs["metadata"]["name"] == "gpu-smoke-10.0.0.1"
    assert pod.inputs["metadata"]["namespace"] == "gpu-pilot"
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "10.0.0.1", "migration.example.com/gpu-dra": "pilot"}
    resources = spec["containers"][0]["resources"]
    assert resources["requests"] == {"example.com/gpu": "1"} == resources["limits"]


def test_deep_merge():
    assert charts.deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": 4}) == {"a": {"b": 1, "c": 3}, "d": 4}
