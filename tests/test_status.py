"""`python -m iks_gpu_migration.status`: real names from outputs, progress per stage, one-line errors."""
import json
import os
import pathlib
import stat

import pytest

from iks_gpu_migration.cli import status
from iks_gpu_migration.kube.records import DRAIN_ANNOTATION, VERIFICATION_ANNOTATION
from tests.emulators.http import LocalServer


UUID0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"


def stack(p: str) -> str:
    """The stack config; `p` is the test's name prefix (node names are cluster-wide on the shared API server)."""
    return (
        "config:\n"
        "  gpu-migration:clusterName: pilot\n"
        '  gpu-migration:kubeVersion: "1.37"\n'
        "  gpu-migration:nodes:\n"
        f"    - {{name: {p}n1, workerId: w1, stage: dra}}\n"
        f"    - {{name: {p}n2, workerId: w2, stage: device-plugin}}\n"
        f"    - {{name: {p}n3, workerId: w3, stage: ibm-managed}}\n"
        # The rest of what `pulumi preview` requires: status validates the stack file as it does.
        "  gpu-migration:gpuOperator: {chart: gpu-operator, repo: 'https://helm.ngc.nvidia.com/nvidia', "
        "version: v25.10.1, namespace: gpu-operator}\n"
        "  gpu-migration:draDriver: {chart: nvidia-dra-driver-gpu, repo: 'https://helm.ngc.nvidia.com/nvidia', "
        "version: 25.8.1, namespace: nvidia-dra-driver-gpu}\n"
        "  gpu-migration:smokeTest: {image: 'nvcr.io/nvidia/cuda:12.9.1-base-ubi9'}\n"
    )


def outputs(p: str) -> dict:
    """As `pulumi stack output --json` prints migration.export's outputs: n1's worker was replaced and came back as
    n1b."""
    return {f"node:{p}n1": {"stage": "dra", "workerId": "w1", "replacedWorkerId": "w1-new", "nodeName": f"{p}n1b",
                            "smokeTest": "passed", "drained": {"evicted": ["ml/a", "ml/b"], "deleted": ["ml/job-1"],
                                                               "skipped": ["op/plugin (DaemonSet plugin keeps it)"]}},
            f"node:{p}n2": {"stage": "device-plugin", "workerId": "w2", "replacedWorkerId": "w2",
                            "nodeName": f"{p}n2"},
            f"node:{p}n3": {"stage": "ibm-managed", "workerId": "w3"}}


@pytest.fixture
def project(tmp_path, kube, monkeypatch):
    p = kube.prefix
    (tmp_path / "Pulumi.pilot.yaml").write_text(stack(p))
    (tmp_path / "outputs.json").write_text(json.dumps(outputs(p)))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no pulumi CLI unless a test puts one there
    monkeypatch.delenv("KUBECONFIG", raising=False)
    kube.add_node(f"{p}n1b", labels={"migration.example.com/gpu-dra": "pilot",
                                     "nvidia.com/gpu.deploy.device-plugin": "false"},
                  annotations={VERIFICATION_ANNOTATION: json.dumps(
                      {"path": "dra", "result": "passed", "gpu": UUID0, "checkedAt": "2026-12-02T12:00:00Z"})})
    # n2's drain happened, its replacement not yet: recorded on the node (kube/records.py record_drain).
    kube.add_node(f"{p}n2", allocatable={"nvidia.com/gpu": "1"}, unschedulable=True, annotations={
        DRAIN_ANNOTATION: json.dumps({"evicted": ["ml/c"], "notAwaited": ["ml/c (node NotReady: ...)"]})})
    kube.add_node(f"{p}n3", kubelet_version="v1.35.4+IKS",
                  labels={"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"})
    return tmp_path


def run(project, capsys, *args, kubeconfig=None):
    argv = ["--stack", "pilot", "--project-dir", str(project), *args]
    if kubeconfig:
        argv += ["--kubeconfig", kubeconfig]
    code = status.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_table_shows_real_names_workers_versions_progress_and_verification(project, kube, capsys):
    p = kube.prefix
    code, out, err = run(project, capsys, "--outputs", str(project / "outputs.json"), kubeconfig=kube.kubeconfig)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "WORKER", "KUBE", "STAGE", "PROGRESS", "CORDONED", "DRAINED", "VERIFICATION"]
    assert lines[1].split() == [f"{p}n1b", "(was", f"{p}n1)", "w1-new", "v1.37.0+IKS", "dra", "4/4", "done", "no",
                                "2", "evicted,", "1", "deleted", "passed", "dra", "at", "2026-12-02T12:00:00Z"]
    assert lines[2].split() == [f"{p}n2", "w2", "v1.37.0+IKS", "device-plugin", "3/4", "(next:", "schedulable)", "yes",
                                "1", "evicted,", "1", "not", "awaited", "-"]
    assert lines[3].split() == [f"{p}n3", "w3", "v1.35.4+IKS", "ibm-managed", "1/1", "done", "no", "-", "-"]


def test_a_renamed_entry_is_found_by_its_key(project, kube, capsys):
    """An entry renamed to the new node keeps its old name as `key`; its outputs stay under node:<key>."""
    p = kube.prefix
    (project / "Pulumi.pilot.yaml").write_text(stack(p).replace(f"{{name: {p}n1, workerId: w1, stage: dra}}",
                                                                f"{{name: {p}n1c, key: {p}n1, workerId: w1, stage: dra}}"))
    code, out, _ = run(project, capsys, "--outputs", str(project / "outputs.json"), kubeconfig=kube.kubeconfig)
    assert code == 0
    assert out.splitlines()[1].split()[:4] == [f"{p}n1b", "(was", f"{p}n1c)", "w1-new"]


def test_json_for_scripts(project, kube, capsys):
    p = kube.prefix
    kube.delete_node(f"{p}n3")
    code, out, _ = run(project, capsys, "--json", "--outputs", str(project / "outputs.json"),
                       kubeconfig=kube.kubeconfig)
    data = json.loads(out)
    assert code == 0 and data["stack"] == "pilot" and data["notes"] == []
    n1, n2, n3 = data["nodes"]
    assert (n1["node"], n1["configuredName"], n1["workerId"], n1["kubeVersion"]) == (f"{p}n1b", f"{p}n1", "w1-new",
                                                                                     "v1.37.0+IKS")
    assert n1["verification"]["gpu"] == UUID0 and n1["verification"]["checkedAt"] == "2026-12-02T12:00:00Z"
    assert [s["step"] for s in n2["steps"] if not s["done"]] == ["schedulable"] and n2["cordoned"] is True
    assert n3["found"] is False and n3["workerId"] == "w3"
    assert n1["drained"]["evicted"] == ["ml/a", "ml/b"] and n2["drained"]["evicted"] == ["ml/c"]


def test_outputs_from_the_pulumi_cli_when_on_path(project, kube, capsys):
    # Stands in for the Pulumi CLI: `pulumi stack output --json --stack S` prints the stack's outputs as one JSON
    # object (pulumi/pulumi pkg/cmd/pulumi/stack/stack_output.go); the args it got are recorded to check them.
    bin_dir = project / "bin"
    bin_dir.mkdir()
    script = bin_dir / "pulumi"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {project}/args\ncat {project}/outputs.json\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin"
    code, out, err = run(project, capsys, kubeconfig=kube.kubeconfig)
    assert code == 0 and err == ""
    assert (project / "args").read_text().split() == ["stack", "output", "--json", "--stack", "pilot"]
    assert out.splitlines()[1].startswith(f"{kube.prefix}n1b (was {kube.prefix}n1)")


def test_without_outputs_it_says_so_and_shows_configured_names(project, kube, capsys):
    code, out, err = run(project, capsys, kubeconfig=kube.kubeconfig)
    assert code == 0
    assert err.startswith("note: pulumi CLI not on PATH") and "--outputs FILE" in err
    assert out.splitlines()[1].split()[:4] == [f"{kube.prefix}n1", "w1", "-", "dra"] and "node not found" in out.splitlines()[1]


def test_failing_pulumi_cli_degrades_with_its_message(project, kube, capsys):
    bin_dir = project / "bin"
    bin_dir.mkdir()
    script = bin_dir / "pulumi"
    script.write_text("#!/bin/sh\necho 'error: no stack named pilot found' >&2\nexit 255\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin"
    code, _, err = run(project, capsys, kubeconfig=kube.kubeconfig)
    assert code == 0
    assert "`pulumi stack output --stack pilot` failed (error: no stack named pilot found)" in err


def one_line_error(project, capsys, *args, kubeconfig=None) -> str:
    code, out, err = run(project, capsys, *args, kubeconfig=kubeconfig)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: ")
    return err.strip()


def test_unknown_stack(project, capsys):
    err = one_line_error(project, capsys, "--stack", "prod")
    assert err == f"error: unknown stack 'prod': no Pulumi.prod.yaml in {project} (stacks here: pilot)"


def test_missing_kubeconfig_names_the_file_and_the_option(project, capsys, monkeypatch):
    err = one_line_error(project, capsys, "--outputs", str(project / "outputs.json"),
                         kubeconfig=str(project / "nope"))
    assert f"kubeconfig {project / 'nope'} (from --kubeconfig) does not exist; pass --kubeconfig PATH" in err
    monkeypatch.setenv("HOME", str(project))
    err = one_line_error(project, capsys, "--outputs", str(project / "outputs.json"))
    assert f"kubeconfig {project}/.kube/config (from the default) does not exist" in err


def test_invalid_kubeconfig_names_the_file(project, capsys):
    bad = project / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    err = one_line_error(project, capsys, "--outputs", str(project / "outputs.json"), kubeconfig=str(bad))
    assert f"kubeconfig {bad} is not usable" in err and "pass --kubeconfig PATH" in err


def with_server(kube, path, url: str) -> str:
    """The test's kubeconfig with its server replaced by `url`."""
    config = json.loads(pathlib.Path(kube.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = url
    path.write_text(json.dumps(config))
    return str(path)


def test_unreachable_api_server(project, kube, capsys):
    from gpu_migration_local.control_plane import free_port
    url = f"https://127.0.0.1:{free_port()}"  # nothing listens there (the shared API server keeps running)
    kubeconfig = with_server(kube, project / "kubeconfig", url)
    err = one_line_error(project, capsys, "--outputs", str(project / "outputs.json"), kubeconfig=kubeconfig)
    assert err.startswith(f"error: cannot reach the Kubernetes API server at {url}")


def test_404_from_something_that_is_not_kubernetes_is_not_node_not_found(project, kube, capsys):
    # e.g. a kubeconfig pointing at a web server or proxy: a plain 404 page, no Kubernetes Status object.
    web = LocalServer(lambda method, path, headers, body: (404, "404 page not found")).start()
    try:
        kubeconfig = with_server(kube, project / "kubeconfig", web.url)
        err = one_line_error(project, capsys, "--outputs", str(project / "outputs.json"), kubeconfig=kubeconfig)
    finally:
        web.stop()
    assert "answered HTTP 404" in err and "not a Kubernetes API answer" in err and "not found" not in err


def test_an_identity_without_the_status_role_is_told_which_role_to_bind(project, kube, capsys):
    kubeconfig = kube.identity("viewer", [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}])
    err = one_line_error(project, capsys, "--outputs", str(project / "outputs.json"), kubeconfig=kubeconfig)
    user = f"system:serviceaccount:{kube.name('identities')}:viewer"
    assert f'refused access (403: nodes "{kube.prefix}n1b" is forbidden: User "{user}" cannot get resource "nodes"' \
        in err, err
    assert "bind the kubeconfig's identity to the ClusterRole gpu-migration-status" in err


def test_the_status_role_is_enough(project, kube, capsys):
    """rbac/gpu-migration-status.yaml: the table with nothing but its rules."""
    import yaml
    from tests.real.identities import RBAC
    role = next(d for d in yaml.safe_load_all((RBAC / "gpu-migration-status.yaml").read_text()) if d["kind"] ==
                "ClusterRole")
    code, out, err = run(project, capsys, "--outputs", str(project / "outputs.json"),
                         kubeconfig=kube.identity("status", role["rules"]))
    assert code == 0 and f"{kube.prefix}n1b (was {kube.prefix}n1)" in out, err


@pytest.mark.parametrize("stage, facts, expected", [
    ("ibm-managed", status.NodeFacts(), "0/1 (next: operator fenced off)"),
    ("device-plugin", status.NodeFacts(kubelet="v1.35.4+IKS"), "2/4 (next: worker replaced)"),
    ("device-plugin", status.NodeFacts(kubelet="v1.37.1", labels={"nvidia.com/gpu.deploy.device-plugin": "false"},
                                       allocatable={"example.com/gpu": "2"}), "3/4 (next: device-plugin labels)"),
    ("dra", status.NodeFacts(kubelet="v1.37.1", labels={"p": "on", "nvidia.com/gpu.deploy.device-plugin": "false"},
                             verification={"path": "dra", "result": "failed"}), "3/4 (next: smoke test passed)"),
    # The GPU Operator deletes deploy.driver from a node with deploy.operands=false: still fenced off.
    ("ibm-managed", status.NodeFacts(labels={"nvidia.com/gpu.deploy.operands": "false"}), "1/1 done"),
    # After a rollback: deploy.device-plugin=true set by the switch, deploy.*=true by the operator; no leftovers.
    ("device-plugin", status.NodeFacts(kubelet="v1.37.1", allocatable={"example.com/gpu": "2"}, labels={
        "nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.driver": "true"}), "4/4 done"),
    ("device-plugin", status.NodeFacts(kubelet="v1.37.1", allocatable={"example.com/gpu": "2"}, labels={"p": "on"}),
     "3/4 (next: device-plugin labels)"),
])
def test_progress(stage, facts, expected):
    assert status.describe_progress(status.progress(stage, facts, "1.37", ("p", "on"), "example.com/gpu")) == expected


def test_a_running_local_session_gives_status_its_pulumi_and_backend(project, kube, capsys, monkeypatch):
    """gpu_migration_local's session records its CLI and environment in .local/session.json: `status` of that stack
    reads the outputs with them, no `eval` of the environment needed (issue 19). A record of another stack, or of a
    session whose process is gone, is ignored."""
    script = project / "session-pulumi"
    script.write_text(f"#!/bin/sh\necho \"$PULUMI_BACKEND_URL $@\" > {project}/args\ncat {project}/outputs.json\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"/bin{os.pathsep}/usr/bin")  # the shell's tools, no pulumi CLI
    (project / ".local").mkdir()
    record = {"pid": os.getpid(), "stack": "pilot", "pulumi": str(script), "env": {"PULUMI_BACKEND_URL": "file:///b"}}
    (project / ".local" / "session.json").write_text(json.dumps(record))
    code, out, err = run(project, capsys, kubeconfig=kube.kubeconfig)
    assert code == 0 and err == "" and out.splitlines()[1].startswith(f"{kube.prefix}n1b (was {kube.prefix}n1)")
    assert (project / "args").read_text().split() == ["file:///b", "stack", "output", "--json", "--stack", "pilot"]
    (project / ".local" / "session.json").write_text(json.dumps({**record, "stack": "local"}))
    code, out, err = run(project, capsys, kubeconfig=kube.kubeconfig)
    assert err.startswith("note: pulumi CLI not on PATH")


# --- the stack file validated as `pulumi preview` validates it; a stopped local environment (issue 39 section 3) ---


def status_error(project: pathlib.Path, capsys, stack: str = "pilot") -> str:
    code, out, err = run_stack(project, capsys, stack)
    assert code == 1 and out == "", out
    return err


def run_stack(project: pathlib.Path, capsys, stack: str):
    (project / "none.json").write_text("{}")  # no stack outputs: the errors come before they matter
    code = status.main(["--stack", stack, "--project-dir", str(project), "--outputs", str(project / "none.json")])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("change, lines", [
    (lambda text: text.replace("gpu-migration:kubeVersion", "gpu-migration:kubeVerison"), [
        "  gpu-migration:kubeVersion: is required",
        "  gpu-migration:kubeVerison: unknown key (got '1.37'); did you mean kubeVersion?"]),
    (lambda text: text.replace("stage: ibm-managed", "stage: done"), [
        "  gpu-migration:nodes[2].stage: 'done' is not one of ibm-managed, device-plugin, dra"]),
    (lambda text: text.replace("version: v25.10.1", "version: 25.10"), [  # YAML: the number 25.1
        "  gpu-migration:gpuOperator.version: 25.1 is a number: YAML reads an unquoted version as one (25.10 as "
        "25.1, 1.30 as 1.3); quote it as you mean it, e.g. \"25.10\""]),
])
def test_an_invalid_stack_file_is_refused_with_the_errors_preview_gives(tmp_path, capsys, change, lines):
    """Before: a misspelt kubeVersion showed every node at `3/4 (next: worker replaced)` with exit 0, an unknown stage
    was printed as it is."""
    (tmp_path / "Pulumi.pilot.yaml").write_text(change(stack("t0-")))
    assert status_error(tmp_path, capsys) == "\n".join(["error: invalid stack config:", *lines]) + "\n"


def test_top_level_values_are_read_as_the_cli_hands_them_to_the_program(tmp_path):
    """The CLI passes a top-level value as a string (`pulumi config --json`, CLI 3.274: `kubeVersion: 1.30` as "1.3",
    `yes` as "yes"), an object's as YAML reads it: `status` validates exactly what `preview` would."""
    (tmp_path / "Pulumi.pilot.yaml").write_text(stack("t0-").replace('"1.37"', "1.30") +
                                                "  gpu-migration:maxUnavailable: 2\n  gpu-migration:flag: yes\n")
    raw = status.program_view(tmp_path / "Pulumi.pilot.yaml")
    assert (raw["kubeVersion"], raw["maxUnavailable"], raw["flag"]) == ("1.3", "2", "yes")
    assert raw["gpuOperator"]["version"] == "v25.10.1" and raw["nodes"][0]["name"] == "t0-n1"


def local_stack(project: pathlib.Path) -> None:
    """A stack of the local environment (Pulumi.local.yaml: IBM Cloud on 127.0.0.1), its kubeconfig where `start`
    writes it, pointing at an API server that is gone."""
    from gpu_migration_local.control_plane import free_port
    text = (stack("t0-") + "  gpu-migration:kubeconfig: .local/kubeconfig\n"
            "  gpu-migration:ibmCloud: {endpoint: 'http://127.0.0.1', iamEndpoint: 'http://127.0.0.1', "
            "allowCustomEndpoints: true}\n")
    (project / "Pulumi.local.yaml").write_text(text)
    (project / ".local").mkdir()
    (project / ".local" / "kubeconfig").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}]}))


def test_after_stop_status_says_no_local_environment_runs_and_how_to_start_one(tmp_path, capsys):
    """Not "check the network/VPN": the stack is the local environment's and no session of it runs (here its record
    is left from a session whose process is gone)."""
    local_stack(tmp_path)
    (tmp_path / ".local" / "session.json").write_text(json.dumps({"pid": 2**22 + 12345, "stack": "local"}))
    hint = (f"error: no local environment is running for stack local: start it with `venv/bin/python -m "
            f"gpu_migration_local --project {tmp_path} start` (docs/operations.md#rehearse-locally)\n")
    assert status_error(tmp_path, capsys, "local") == hint
    (tmp_path / ".local" / "kubeconfig").unlink()  # never started in this project
    assert status_error(tmp_path, capsys, "local") == hint
