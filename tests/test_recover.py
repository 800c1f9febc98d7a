"""Recovery after a killed `up`: which pending creates are adopted, under which ID (the real-engine scenario in
tests/real/test_migration_scenarios.py runs the whole recovery)."""
from iks_gpu_migration.cli.recover import Cli, adopt_pending, pending_creates, provider_id, repair_file_backend


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


def test_an_empty_checkpoint_sidecar_left_by_a_kill_is_removed_and_readable_ones_are_kept(tmp_path):
    """A kill during a file-backend checkpoint write leaves `<stack>.json.attrs` empty (gocloud.dev fileblob writes it
    before renaming the new checkpoint in); `pulumi` then fails with "failed to load checkpoint: EOF"."""
    stacks = tmp_path / "backend" / ".pulumi" / "stacks" / "gpu-migration"
    stacks.mkdir(parents=True)
    for name, text in [("pilot.json.attrs", ""), ("pilot.json.bak.attrs", '{"md5": "x"}'), ("other.json.attrs", "")]:
        (stacks / name).write_text(text)
    fake = tmp_path / "pulumi"  # answers `pulumi whoami --json` as the real CLI does for a file backend
    fake.write_text(f"#!/bin/sh\necho '{{\"user\": \"me\", \"url\": \"{(tmp_path / 'backend').as_uri()}\"}}'\n")
    fake.chmod(0o755)
    lines: list[str] = []
    repair_file_backend(Cli(str(fake), "pilot"), lines.append)
    assert sorted(p.name for p in stacks.iterdir()) == ["other.json.attrs", "pilot.json.bak.attrs"]
    assert len(lines) == 1 and "pilot.json.attrs" in lines[0]
