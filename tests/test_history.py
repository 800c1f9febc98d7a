"""`python -m iks_gpu_migration.cli.history` (issue 39 section 1): the stack's updates with each node's stage, what
restoring one changes, and its `gpu-migration:*` config written back into the stack file with comments, quoting,
secrets and every other key as they were; validated as `preview` validates; a failed update only when asked; every
error one line, the file untouched."""
import json
import os
import stat
import time

import pytest

from iks_gpu_migration.cli import history
from iks_gpu_migration.cli.history_config import MISSING, restored_text, same

STACK = """\
# Pilot: move a node by changing its stage.
config:
  gpu-migration:clusterName: pilot
  gpu-migration:kubeVersion: "1.37"  # quoted: an unquoted 1.30 is 1.3
  gpu-migration:maxUnavailable: 1
  gpu-migration:ibmApiKey:
    secure: v1:c2VjcmV0:AAAAciphertextAAAA
  gpu-migration:nodes:
    # list order is replacement order
    - name: n1
      workerId: w1
      stage: dra  # the first pilot node
    - name: n2
      workerId: w2
      stage: dra
    - name: n3
      workerId: w3
      stage: ibm-managed
  gpu-migration:gpuOperator: {chart: gpu-operator, repo: 'https://helm.ngc.nvidia.com/nvidia', version: v25.10.1, namespace: gpu-operator}
  gpu-migration:draDriver: {chart: nvidia-dra-driver-gpu, repo: 'https://helm.ngc.nvidia.com/nvidia', version: 25.8.1, namespace: nvidia-dra-driver-gpu}
  gpu-migration:smokeTest: {image: 'nvcr.io/nvidia/cuda:12.9.1-base-ubi9'}
  gpu-migration:timeouts:
    drain: 300  # GPU pods get five minutes
    pollInterval: 1
  other:setting: keep me  # another namespace: never restored
encryptionsalt: v1:c2FsdA==:v1:AAAA
"""
OPERATOR = {"chart": "gpu-operator", "repo": "https://helm.ngc.nvidia.com/nvidia", "version": "v25.10.1",
            "namespace": "gpu-operator"}
DRA_DRIVER = {"chart": "nvidia-dra-driver-gpu", "repo": "https://helm.ngc.nvidia.com/nvidia", "version": "25.8.1",
              "namespace": "nvidia-dra-driver-gpu"}


def config(n2: str = "dra", **over) -> dict:
    """An update's config as the CLI prints it: top-level scalars as strings, objects also parsed, a secret blind."""
    values = {"clusterName": "pilot", "kubeVersion": "1.37", "maxUnavailable": "1",
              "nodes": [{"name": "n1", "workerId": "w1", "stage": "dra"}, {"name": "n2", "workerId": "w2", "stage": n2},
                        {"name": "n3", "workerId": "w3", "stage": "ibm-managed"}],
              "gpuOperator": OPERATOR, "draDriver": DRA_DRIVER,
              "smokeTest": {"image": "nvcr.io/nvidia/cuda:12.9.1-base-ubi9"},
              "timeouts": {"drain": 300, "pollInterval": 1}, **over}
    out = {f"gpu-migration:{k}": ({"value": json.dumps(v), "objectValue": v, "secret": False}
                                  if isinstance(v, (dict, list)) else {"value": v, "secret": False})
           for k, v in values.items() if v is not MISSING}
    return {**out, "gpu-migration:ibmApiKey": {"secret": True}, "other:setting": {"value": "then", "secret": False}}


def update(cfg: dict, result: str = "succeeded", start: str = "2026-12-04T10:00:00.000Z") -> dict:
    return {"version": 0, "kind": "update", "startTime": start, "message": "", "environment": {}, "config": cfg,
            "result": result, "endTime": start, "resourceChanges": {"update": 1}}


# newest first, as the CLI prints it; on the file backend every version is 0
HISTORY = [update(config(), start="2026-12-04T12:00:00.000Z"),
           update(config("device-plugin", maxUnavailable="2", timeouts={"pollInterval": 1}), result="failed",
                  start="2026-12-04T11:00:00.000Z"),
           update(config("device-plugin"), start="2026-12-04T10:00:00.000Z")]


@pytest.fixture
def project(tmp_path):
    (tmp_path / "Pulumi.pilot.yaml").write_text(STACK)
    (tmp_path / "history.json").write_text(json.dumps(HISTORY))
    return tmp_path


def run(project, capsys, *args) -> tuple[int, str, str]:
    code = history.main(["--stack", "pilot", "--project-dir", str(project), "--history", str(project / "history.json"),
                         *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_list_numbers_updates_from_the_oldest_and_shows_each_nodes_stage(project, capsys):
    code, out, err = run(project, capsys)
    assert code == 0 and err == ""
    rows = out.splitlines()
    assert rows[1].split()[:4] == ["#", "STARTED", "KIND", "RESULT"]
    assert rows[2].split()[:4] == ["3", "2026-12-04T12:00:00Z", "update", "succeeded"]
    assert rows[2].endswith("ibm-managed: n3; dra: n1, n2  (= Pulumi.pilot.yaml)")  # the stack file's config now
    assert rows[3].split()[:4] == ["2", "2026-12-04T11:00:00Z", "update", "failed"]
    assert rows[3].endswith("ibm-managed: n3; device-plugin: n2; dra: n1")
    code, out, _ = run(project, capsys, "--json")
    listed = json.loads(out)["updates"]
    assert [(u["number"], u["result"], u["matchesStackFile"]) for u in listed] == [
        (3, "succeeded", True), (2, "failed", False), (1, "succeeded", False)]
    assert listed[2]["stages"] == {"n1": "dra", "n2": "device-plugin", "n3": "ibm-managed"}


def test_restoring_changes_only_the_nodes_stage_and_keeps_comments_secrets_and_other_keys(project, capsys):
    before = (project / "Pulumi.pilot.yaml").stat()
    code, out, err = run(project, capsys, "--restore", "1")
    assert code == 0, err
    assert out.splitlines()[:2] == ["update #1 (update, 2026-12-04T10:00:00Z, succeeded) -> Pulumi.pilot.yaml:",
                                    "  node n2: stage dra -> device-plugin"]
    assert "next: `pulumi preview --stack pilot` shows the rollback" in out
    after = (project / "Pulumi.pilot.yaml").read_text()
    # one line changed, the rest byte for byte: comments, quoting, the secret's ciphertext, other namespaces, salt
    assert after == STACK.replace("      workerId: w2\n      stage: dra\n",
                                  "      workerId: w2\n      stage: device-plugin\n")
    assert stat.S_IMODE(os.stat(project / "Pulumi.pilot.yaml").st_mode) == stat.S_IMODE(before.st_mode)
    assert sorted(p.name for p in project.iterdir()) == ["Pulumi.pilot.yaml", "history.json"]  # no temporary left
    code, out, _ = run(project, capsys, "--restore", "1")  # again: nothing left to change
    assert code == 0
    assert out.splitlines()[-1] == "Pulumi.pilot.yaml already holds its gpu-migration:* config: nothing to write"


def test_a_failed_update_is_restored_only_when_asked_and_other_keys_are_shown(project, capsys):
    code, out, err = run(project, capsys, "--restore", "2")
    assert code == 1 and out == "" and err == (
        "error: --restore 2: update #2 (update, 2026-12-04T11:00:00Z, failed) did not succeed, so its config may be "
        "what broke it; pass --allow-failed to restore it anyway\n")
    assert (project / "Pulumi.pilot.yaml").read_text() == STACK
    code, out, err = run(project, capsys, "--restore", "2", "--allow-failed")
    assert code == 0, err
    assert out.splitlines()[1:4] == ["  node n2: stage dra -> device-plugin", "  gpu-migration:maxUnavailable: 1 -> 2",
                                     "  gpu-migration:timeouts.drain: 300 -> (unset)"]
    after = (project / "Pulumi.pilot.yaml").read_text()
    assert "  gpu-migration:maxUnavailable: 2\n" in after  # a number stays a number
    assert "  gpu-migration:timeouts:\n    pollInterval: 1\n" in after and "drain:" not in after
    assert "# list order is replacement order" in after and "secure: v1:c2VjcmV0:AAAAciphertextAAAA" in after


def test_a_dry_run_shows_and_validates_and_writes_nothing(project, capsys):
    code, out, err = run(project, capsys, "--restore", "1", "--dry-run")
    assert code == 0, err
    assert "  node n2: stage dra -> device-plugin" in out and out.splitlines()[-1].startswith("dry run: ")
    assert (project / "Pulumi.pilot.yaml").read_text() == STACK
    assert sorted(p.name for p in project.iterdir()) == ["Pulumi.pilot.yaml", "history.json"]


def test_a_result_preview_would_refuse_is_not_written_and_names_the_key(project, capsys):
    bad = [update(config("dra", kubeVersion="1.36"))] + HISTORY
    (project / "history.json").write_text(json.dumps(bad))
    code, out, err = run(project, capsys, "--restore", "4")
    assert code == 1 and out == ""
    assert err.startswith("error: update #4 (update, 2026-12-04T10:00:00Z, succeeded)'s config does not pass "
                          "preview's validation today, so Pulumi.pilot.yaml was left as it was:\ninvalid stack config:")
    assert "gpu-migration:nodes[0].stage: node 'n1' is at stage 'dra', which needs kubeVersion >= 1.37 (got '1.36')" \
        in err
    assert (project / "Pulumi.pilot.yaml").read_text() == STACK
    assert sorted(p.name for p in project.iterdir()) == ["Pulumi.pilot.yaml", "history.json"]


@pytest.mark.parametrize("args, message", [
    (["--restore", "7"], "--restore 7: the stack's history has no update #7 (updates: #1-#3)"),
    (["--restore", "0"], "--restore 0: the stack's history has no update #0 (updates: #1-#3)"),
])
def test_an_unknown_update_is_named(project, capsys, args, message):
    code, out, err = run(project, capsys, *args)
    assert code == 1 and err == f"error: {message}\n" and out == ""
    assert (project / "Pulumi.pilot.yaml").read_text() == STACK


def test_secrets_are_kept_whichever_side_has_them(project, capsys):
    then = config("device-plugin")
    del then["gpu-migration:ibmApiKey"]  # set after that update
    (project / "history.json").write_text(json.dumps([update(then)]))
    code, out, err = run(project, capsys, "--restore", "1")
    assert code == 0, err
    assert "  kept: gpu-migration:ibmApiKey: a secret" in out
    assert "secure: v1:c2VjcmV0:AAAAciphertextAAAA" in (project / "Pulumi.pilot.yaml").read_text()


def test_nodes_that_come_back_or_leave_and_a_new_order_are_named(project, capsys):
    nodes = [{"name": "n2", "workerId": "w2", "stage": "device-plugin"}, {"name": "n1", "workerId": "w1",
                                                                          "stage": "dra"},
             {"name": "n4", "workerId": "w4", "stage": "ibm-managed"}]
    (project / "history.json").write_text(json.dumps([update(config(nodes=nodes))]))
    code, out, err = run(project, capsys, "--restore", "1", "--dry-run")
    assert code == 0, err
    assert out.splitlines()[1:5] == [
        "  node n2: stage dra -> device-plugin",
        "  node n3: leaves the stack file (stage ibm-managed now; it was not listed then)",
        "  node n4: back in the stack file, stage ibm-managed",
        "  gpu-migration:nodes: the order changes (it is the replacement order): n2, n1, n4"]


@pytest.mark.parametrize("script, message", [
    ("echo 'error: no stack named pilot found' >&2; exit 255",
     "`pulumi stack history --stack pilot --json --page-size 0` failed (exit 255: error: no stack named pilot found)"),
    ("echo 'not json'", "`pulumi stack history --stack pilot --json --page-size 0` printed no JSON: not json"),
    ("sleep 60", "`pulumi stack history --stack pilot --json --page-size 0` did not answer within 1s: is the backend "
                 "reachable (`pulumi whoami -v`)?"),
])
def test_the_cli_is_run_bounded_and_its_failure_named(project, capsys, monkeypatch, script, message):
    bin_dir = project / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "pulumi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(history, "HISTORY_TIMEOUT", 1)
    started = time.monotonic()
    code = history.main(["--stack", "pilot", "--project-dir", str(project)])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err == f"error: {message}\n"
    assert time.monotonic() - started < 30  # the CLI's shell and its sleep killed together at the timeout


def test_the_cli_is_asked_for_every_update(project, capsys, monkeypatch):
    bin_dir = project / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(f"#!/bin/sh\necho \"$@\" > {project}/args\ncat {project}/history.json\n")
    (bin_dir / "pulumi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert history.main(["--stack", "pilot", "--project-dir", str(project)]) == 0
    assert (project / "args").read_text() == "stack history --stack pilot --json --page-size 0\n"
    assert "(= Pulumi.pilot.yaml)" in capsys.readouterr().out


def test_unreadable_inputs_are_one_line_each(project, capsys):
    (project / "history.json").write_text("[{\"config\": []}]")
    code, _, err = run(project, capsys)
    assert code == 1 and err.startswith(f"error: --history {project / 'history.json'}: not the JSON of `pulumi stack "
                                        f"history --stack pilot --json --page-size 0` (history entry 0")
    code = history.main(["--stack", "prod", "--project-dir", str(project), "--history", str(project / "x")])
    assert code == 1 and capsys.readouterr().err == (f"error: no Pulumi.prod.yaml in {project} (stack files here: "
                                                     f"Pulumi.pilot.yaml)\n")


def test_the_file_layout_is_kept_and_values_compare_as_the_program_reads_them():
    flat = "config:\n  gpu-migration:nodes:\n  - name: a  # entry\n    stage: dra\n  x:y: 1\n"
    text, exact = restored_text(flat, {"nodes": [{"name": "a", "stage": "device-plugin"}]})
    assert exact and text == flat.replace("stage: dra", "stage: device-plugin")
    assert same(1, 1.0) and not same(True, 1) and same({"a": 1, "b": [1]}, {"b": [1.0], "a": 1})


def test_a_stack_file_edited_meanwhile_is_not_overwritten(project, capsys, monkeypatch):
    real_parse = history.parse

    def edited_while_validating(raw):
        (project / "Pulumi.pilot.yaml").write_text(STACK + "# an edit of someone else\n")
        return real_parse(raw)

    monkeypatch.setattr(history, "parse", edited_while_validating)
    code, out, err = run(project, capsys, "--restore", "1")
    assert code == 1 and err == ("error: Pulumi.pilot.yaml changed while this command ran; nothing was written: run it "
                                 "again\n")
    assert (project / "Pulumi.pilot.yaml").read_text() == STACK + "# an edit of someone else\n"
    assert sorted(p.name for p in project.iterdir()) == ["Pulumi.pilot.yaml", "history.json"]


def test_a_top_level_value_reads_back_as_the_string_the_cli_recorded(tmp_path):
    """The CLI hands a top-level scalar to the program as its text (status_inputs.program_view): whatever was there
    before, the restored file must give back exactly the recorded string (`1.30` written plain would be 1.3)."""
    recorded = {"kubeVersion": "1.30", "maxUnavailable": "10%", "batchSoakSeconds": "30", "pendingGpuPodsGate": "true",
                "clusterName": "007", "extendedResourceName": "example.com/gpu"}
    before = ('config:\n  gpu-migration:kubeVersion: "1.37"\n  gpu-migration:maxUnavailable: 1\n'
              '  gpu-migration:clusterName: pilot\n')
    text, _ = restored_text(before, recorded)
    (tmp_path / "Pulumi.x.yaml").write_text(text)
    assert history.program_view(tmp_path / "Pulumi.x.yaml") == recorded
    assert '  gpu-migration:kubeVersion: "1.30"\n' in text and "  gpu-migration:batchSoakSeconds: 30\n" in text
