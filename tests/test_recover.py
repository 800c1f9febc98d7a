"""Recovery after a killed `up`: which pending creates are adopted, under which ID (the real-engine scenario in
tests/real/test_migration_scenarios.py runs the whole recovery)."""
from iks_gpu_migration.cli.recover import adopt_pending, pending_creates, provider_id


def test_ids_follow_pulumi_kubernetes():
    release = {"type": "kubernetes:helm.sh/v3:Release", "inputs": {"name": "gpu-operator", "namespace": "gpu-operator"}}
    assert provider_id(release) == "gpu-operator/gpu-operator"
    assert provider_id({"type": "kubernetes:core/v1:Pod",
                        "inputs": {"metadata": {"name": "gpu-smoke-a", "namespace": "gpu-pilot"}}}) == "gpu-pilot/gpu-smoke-a"
    assert provider_id({"type": "kubernetes:resource.k8s.io/v1:DeviceClass",
                        "inputs": {"metadata": {"name": "nvidia.com-gpu"}}}) == "nvidia.com-gpu"


def test_nothing_to_import_for_patches_and_dynamic_resources():
    assert provider_id({"type": "kubernetes:core/v1:NodePatch", "inputs": {"metadata": {"name": "10.0.0.1"}}}) is None
    assert provider_id({"type": "pulumi-python:dynamic/gpu-migration:WorkerReplacement", "inputs": {}}) is None
    assert provider_id({"type": "kubernetes:core/v1:Pod", "inputs": {"metadata": {}}}) is None


def test_only_pending_creates_are_resolved():
    deployment = {"pending_operations": [{"type": "creating", "resource": {"urn": "a"}},
                                         {"type": "updating", "resource": {"urn": "b"}}]}
    assert [r["urn"] for r in pending_creates(deployment)] == ["a"]
    assert pending_creates({}) == []


def test_adopted_creates_join_the_resources_last_with_their_id_and_the_rest_are_dropped():
    deployment = {"manifest": {"m": 1},
                  "resources": [{"urn": "provider", "id": "p"}],
                  "pending_operations": [
                      {"type": "creating", "resource": {"urn": "release", "inputs": {"name": "r"}}},
                      {"type": "creating", "resource": {"urn": "replacement", "inputs": {}}},
                      {"type": "updating", "resource": {"urn": "provider"}}]}
    adopted = adopt_pending(deployment, {"release": "ns/r"})
    assert adopted["resources"] == [{"urn": "provider", "id": "p"},
                                    {"urn": "release", "inputs": {"name": "r"}, "id": "ns/r", "outputs": {}}]
    assert adopted["pending_operations"] == [] and adopted["manifest"] == {"m": 1}
    assert len(deployment["resources"]) == 1 and len(deployment["pending_operations"]) == 3  # input untouched
