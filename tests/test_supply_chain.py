"""Where the program pulls code from (config/sources.py): image references with digests, chart sources (https:// or
oci://, local charts only in the local environment), Helm's provenance check; one clear error naming the key."""
import copy

import pulumi
import pytest

from harness import registered_by, run_program, stack_config
from iks_gpu_migration.components import charts
from iks_gpu_migration.config import ConfigError, HelmChart, parse

DIGEST = "sha256:" + "0123456789abcdef" * 4
OPERATOR = {"chart": "gpu-operator", "repo": "https://helm.ngc.nvidia.com/nvidia", "version": "v25.10.1",
            "namespace": "gpu-operator"}


@pytest.fixture
def raw():
    return copy.deepcopy(stack_config("pilot"))


def problems_for(raw) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse(raw)
    return str(e.value).splitlines()[1:]


@pytest.mark.parametrize("image", [
    "nvcr.io/nvidia/cuda:12.9.1-base-ubi9",
    f"nvcr.io/nvidia/cuda:12.9.1-base-ubi9@{DIGEST}",
    f"nvcr.io/nvidia/cuda@{DIGEST}",
    "cuda",
    "localhost:5000/team/cuda_base:v1.2",
    "registry.example.com:443/a/b/c:1",
])
def test_valid_image_references(raw, image):
    raw["smokeTest"]["image"] = image
    assert parse(raw).smoke_test.image == image


@pytest.mark.parametrize("image, expected", [
    (f"nvcr.io/nvidia/cuda:12.9.1@{DIGEST[:-1]}", "the digest 'sha256:0123"),
    ("nvcr.io/nvidia/cuda:12.9.1@sha256:" + "A" * 64, "must be sha256:<64 hex digits> (lowercase)"),
    (f"nvcr.io/nvidia/cuda@sha512:{'0' * 128}", "must be sha256:<64 hex digits>"),
    ("nvcr.io/nvidia/cuda@", "the digest '' must be"),
    ("nvcr.io/NVIDIA/cuda:12.9.1", "is not an image reference: name[:tag][@sha256:<64 hex digits>]"),
    ("nvcr.io/nvidia/cuda:12.9.1 --privileged", "is not an image reference"),
    ("https://nvcr.io/nvidia/cuda", "is not an image reference"),
    ("nvcr.io/nvidia/cuda:" + "t" * 129, "is not an image reference"),
])
def test_bad_image_reference_is_one_error_naming_the_key(raw, image, expected):
    raw["smokeTest"]["image"] = image
    (problem,) = problems_for(raw)
    assert problem.startswith("  gpu-migration:smokeTest.image: ") and expected in problem, problem


def warnings_of(raw, monkeypatch) -> list[str]:
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    run_program(raw)
    return [w for w in warned if "smokeTest.image" in w]


@pytest.mark.parametrize("stack", ["pilot", "prod"])
def test_shipped_stacks_pin_the_smoke_image_by_digest_without_a_warning(stack, monkeypatch):
    raw = copy.deepcopy(stack_config(stack))
    name, _, digest = raw["smokeTest"]["image"].partition("@")
    # NVIDIA's pin of this tag (NVIDIA/gpu-operator 3581b1689, c2880372d); see the comment in the stack file.
    assert (name, digest) == ("nvcr.io/nvidia/cuda:12.8.1-base-ubi9",
                              "sha256:e8e8680c1e230a63f900f1f9b692af791644f6f14bdc54920f7a7c7f4a6a327b")
    assert warnings_of(raw, monkeypatch) == []


def test_an_image_by_tag_warns_once_outside_the_local_environment(raw, monkeypatch):
    image = raw["smokeTest"]["image"] = "nvcr.io/nvidia/cuda:12.9.1-base-ubi9"
    assert warnings_of(raw, monkeypatch) == [
        f"smokeTest.image {image} is pulled by tag, which the registry can move: pin it by digest, smokeTest.image: "
        f"{image}@sha256:<64 hex digits> (`crane digest <image>` or `skopeo inspect --format '{{{{.Digest}}}}' "
        f"docker://<image>`)"]
    raw["smokeTest"]["image"] = f"{image}@{DIGEST}"
    assert warnings_of(raw, monkeypatch) == []
    raw["smokeTest"]["image"] = image
    raw["ibmCloud"] = {"endpoint": "http://127.0.0.1:18480", "iamEndpoint": "http://127.0.0.1:18480",
                      "allowCustomEndpoints": True}
    assert warnings_of(raw, monkeypatch) == []  # the local environment's images are doubles


@pytest.mark.parametrize("repo", ["http://helm.ngc.nvidia.com/nvidia", "file:///srv/charts", "/srv/charts",
                                  "helm.ngc.nvidia.com/nvidia", "https://"])
def test_chart_repo_must_be_https_or_oci(raw, repo):
    raw["gpuOperator"]["repo"] = repo
    (problem,) = problems_for(raw)
    assert problem.startswith(f"  gpu-migration:gpuOperator.repo: {repo!r} must be an https:// chart repository or "
                              f"an oci:// registry"), problem


@pytest.mark.parametrize("chart, repo, expected", [
    ("http://charts.example.com/gpu-operator-v25.10.1.tgz", "", "a chart comes from an https:// repository"),
    ("file:///srv/charts/gpu-operator", "", "a chart comes from an https:// repository"),
    (f"oci://nvcr.io/nvidia/gpu-operator@{DIGEST[:-2]}", "", "the digest"),
    ("oci://nvcr.io/nvidia/gpu-operator:v26.7.0", "", "names tag 'v26.7.0' but `version` is 'v25.10.1'"),
    ("oci://nvcr.io/nvidia/gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "keep one of the two"),
    ("nvidia/gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "give the chart's name only (gpu-operator)"),
    ("charts/gpu-operator", "", "is not from an https:// repository or an oci:// registry"),
    ("/home/me/gpu-operator-v25.10.1.tgz", "", "a local chart (or one from your own `helm repo add` list) only in"),
    ("nvidia/gpu-operator", "", "is not from an https:// repository or an oci:// registry"),
])
def test_bad_chart_source_is_one_error_naming_the_key(raw, chart, repo, expected):
    raw["gpuOperator"].update(chart=chart, repo=repo)
    (problem,) = problems_for(raw)
    assert problem.startswith("  gpu-migration:gpuOperator.chart: ") and expected in problem, problem


@pytest.mark.parametrize("chart, repo", [
    ("gpu-operator", "https://helm.ngc.nvidia.com/nvidia"),
    ("gpu-operator", "oci://nvcr.io/nvidia/cloud-native-charts"),
    ("oci://nvcr.io/nvidia/cloud-native-charts/gpu-operator", ""),
    (f"oci://nvcr.io/nvidia/cloud-native-charts/gpu-operator@{DIGEST}", ""),
    ("oci://nvcr.io/nvidia/cloud-native-charts/gpu-operator:v25.10.1", ""),
    ("https://charts.example.com/gpu-operator-v25.10.1.tgz", ""),
])
def test_remote_chart_sources_are_accepted(raw, chart, repo):
    raw["gpuOperator"].update(chart=chart, repo=repo)
    assert parse(raw).gpu_operator.chart == chart


def test_local_charts_only_in_the_local_environment(raw):
    raw["gpuOperator"].update(chart="gpu_migration_local/charts/gpu-operator", repo="")
    assert problems_for(raw)
    raw["ibmCloud"] = {"endpoint": "http://127.0.0.1:18480", "iamEndpoint": "http://127.0.0.1:18480",
                      "allowCustomEndpoints": True}
    assert parse(raw).gpu_operator.chart == "gpu_migration_local/charts/gpu-operator"
    local = stack_config("local")
    local.pop("kubeconfig")  # made by the local environment when it runs
    assert parse(local).local_environment


def release_inputs(**chart) -> dict:
    (release,) = registered_by(lambda: charts.helm_release("gpu-operator", HelmChart(**{**OPERATOR, **chart}), {}))
    return release.inputs


def test_an_oci_repository_joins_the_chart_reference():
    """pulumi-kubernetes would look an index.yaml up in an oci:// repository URL (helm_release.go locateChart)."""
    inputs = release_inputs(repo="oci://nvcr.io/nvidia/cloud-native-charts/")
    assert inputs["chart"] == "oci://nvcr.io/nvidia/cloud-native-charts/gpu-operator"
    assert not inputs.get("repositoryOpts")
    inputs = release_inputs(chart=f"oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu@{DIGEST}",
                            repo="")
    assert inputs["chart"].endswith(f"@{DIGEST}") and not inputs.get("repositoryOpts")
    assert release_inputs()["repositoryOpts"]["repo"] == OPERATOR["repo"]


def test_provenance_check_reaches_the_release(raw, tmp_path):
    keyring = tmp_path / "nvidia.gpg"
    keyring.write_bytes(b"")
    inputs = release_inputs(verify=True, keyring=str(keyring))
    assert inputs["verify"] is True and inputs["keyring"] == str(keyring)
    assert "verify" not in release_inputs() and "keyring" not in release_inputs()  # no diff for existing releases
    raw["draDriver"].update(verify=True, keyring=str(keyring))
    assert parse(raw).dra_driver.verify


def test_keyring_errors_name_the_key(raw, tmp_path):
    raw["draDriver"]["keyring"] = str(tmp_path / "missing.gpg")
    (problem,) = problems_for(raw)
    assert problem == f"  gpu-migration:draDriver.keyring: keyring file {str(tmp_path / 'missing.gpg')!r} does not exist"
    (tmp_path / "missing.gpg").write_bytes(b"")
    (problem,) = problems_for(raw)
    assert problem == ("  gpu-migration:draDriver.keyring: is read only with verify: true; set verify: true or leave "
                       "keyring out")
