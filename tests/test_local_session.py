"""The rehearsal's session commands (gpu_migration_local/session.py, pulumi_cli.py) without a cluster: which CLI
commands get the program served, the arguments passed through, the shell exports, and a clear stop without a
session. The whole rehearsal runs under the real CLI in tests/real/test_rehearsal.py."""
import json
import os
import shlex

import pytest

from gpu_migration_local import pulumi_cli, session


@pytest.mark.parametrize("args, runs", [
    (["up", "--stack", "local", "--yes"], True),
    (["preview", "--stack", "local", "--json"], True),
    (["--cwd", "up", "stack", "history"], False),  # `up` is the value of --cwd here
    (["-C", ".", "destroy"], True),
    (["refresh", "--stack", "local"], True),
    (["stack", "history", "--stack", "local"], False),
    (["config", "set", "gpu-migration:maxUnavailable", "2"], False),
    (["stack", "output", "--json"], False),
    ([], False),
])
def test_only_commands_that_run_the_program_get_it_served(args, runs):
    assert pulumi_cli.runs_program(args) is runs


def test_every_argument_is_passed_through_and_the_program_server_added_last(monkeypatch, tmp_path):
    monkeypatch.setattr(session.tools, "bin_dir", lambda: tmp_path)
    monkeypatch.setattr(pulumi_cli.tools, "bin_dir", lambda: tmp_path)
    args = ["up", "--stack", "local", "--yes", "--config", "a=b c"]
    assert pulumi_cli.command_for(args, 4711) == [str(tmp_path / "pulumi"), *args, "--client=127.0.0.1:4711",
                                                  "--exec-kind", "auto.inline", "--parallel", "64"]
    assert pulumi_cli.command_for(["stack", "history"], None) == [str(tmp_path / "pulumi"), "stack", "history"]


def test_up_and_preview_get_a_parallel_that_moves_every_node_in_flight_unless_one_is_given(monkeypatch, tmp_path):
    monkeypatch.setattr(pulumi_cli.tools, "bin_dir", lambda: tmp_path)
    served = ["--client=127.0.0.1:1", "--exec-kind", "auto.inline"]
    assert pulumi_cli.command_for(["up", "--yes"], 1)[-2:] == ["--parallel", "64"]
    assert pulumi_cli.command_for(["preview"], 1)[-2:] == ["--parallel", "64"]
    assert pulumi_cli.command_for(["up", "-p", "3"], 1)[-3:] == served
    assert pulumi_cli.command_for(["up", "--parallel=3"], 1)[-3:] == served
    assert pulumi_cli.command_for(["refresh"], 1)[-3:] == served  # walks no plan


def test_a_cli_ended_by_a_signal_says_so_and_that_recover_is_next():
    text = pulumi_cli.killed_message(-9, ["up", "--stack", "local"])
    assert text.startswith("the Pulumi CLI running `up` was ended by SIGKILL; run `venv/bin/python -m "
                           "iks_gpu_migration.cli.recover --stack <stack>` next")
    assert pulumi_cli.killed_message(-15, ["stack", "history"]) == \
        "the Pulumi CLI running `stack` was ended by SIGTERM"


def test_exports_survive_the_shell(tmp_path):
    record = {"pid": os.getpid(), "bin": str(tmp_path / "bin dir"),
              "env": {"PULUMI_BACKEND_URL": "file:///x/.local/backend",
                      "PULUMI_CONFIG_PASSPHRASE": "local passphrase; $HOME", "KUBECONFIG": "/k"}}
    exports = session.shell_exports(record)
    parsed = {}
    for line in exports.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        parsed[key] = shlex.split(value)[0]
    assert parsed["PULUMI_CONFIG_PASSPHRASE"] == "local passphrase; $HOME"
    # The session's `pulumi` first (session.write_pulumi_wrapper): the bare CLI can't run the program here.
    assert parsed["PATH"].split(os.pathsep)[0] == str(tmp_path / "bin dir") and parsed["KUBECONFIG"] == "/k"


def test_without_a_running_session_commands_say_how_to_start_one_and_stop_succeeds(tmp_path):
    paths = session.Paths(tmp_path)
    with pytest.raises(session.SessionError, match="no local environment is running: start it with `.* start`"):
        pulumi_cli.main(["stack", "ls"], paths)
    paths.state.mkdir()
    # A killed session's leftovers: its record and lock file, with a pid that is gone and the lock free.
    paths.session.write_text(json.dumps({"pid": 2**22 + 12345, "env": {}}))
    paths.lock.write_text(str(2**22 + 12345))
    assert session.read_session(paths) is None
    with pytest.raises(session.SessionError, match="no local environment is running"):
        session.require_session(paths)
    said = []
    assert session.stop(paths, say=said.append) == 0 and session.stop(paths, say=said.append) == 0
    assert said == [f"no local environment of {tmp_path} is running: nothing to stop"] * 2


def test_a_stack_that_points_at_ibm_cloud_is_refused_naming_the_key(tmp_path):
    import shutil
    from gpu_migration_local.session import REPO
    shutil.copy(REPO / "Pulumi.pilot.yaml", tmp_path / "Pulumi.pilot.yaml")
    with pytest.raises(session.SessionError) as e:
        session.Session(session.Paths(tmp_path), "pilot", say=lambda line: None).run()
    assert "Pulumi.pilot.yaml: gpu-migration:ibmCloud.endpoint is not set, not the local IKS emulator" in str(e.value)
    assert not (tmp_path / ".local").exists()  # refused before anything started


def test_the_demo_closes_with_what_each_node_proved():
    from types import SimpleNamespace

    from gpu_migration_local.__main__ import summary
    outputs = {
        "node:10.240.0.11": SimpleNamespace(value={"configName": "10.240.0.11", "stage": "dra",
                                                   "replacedWorkerId": "w-9", "nodeName": "10.240.0.25",
                                                   "smokeTest": "passed: gpu-pilot/p used gpu-0 (GPU-1)"}),
        "node:10.240.0.13": SimpleNamespace(value={"configName": "10.240.0.13", "stage": "ibm-managed"}),
        "other": SimpleNamespace(value=1)}
    assert summary(outputs).splitlines()[2:] == [
        "  10.240.0.11: stage dra, worker replaced by w-9 (node 10.240.0.25); smoke test passed: gpu-pilot/p used "
        "gpu-0 (GPU-1)",
        "  10.240.0.13: stage ibm-managed, kept on IBM's drivers and fenced off the GPU Operator"]


def test_a_first_build_without_room_on_disk_is_refused_naming_each_filesystem(tmp_path):
    from gpu_migration_local import tools
    places = {"tools": tmp_path / "cache" / "tools", "GOMODCACHE": tmp_path / "go" / "mod",
              "GOCACHE": tmp_path / "go-build"}
    assert tools.disk_shortfall(places, free_gb=lambda p: 100.0) == []
    short = tools.disk_shortfall(places, free_gb=lambda p: 5.0)  # one filesystem: the needs add up
    assert short == [f"5.0 GB free on the filesystem of tools ({places['tools']}), GOMODCACHE ({places['GOMODCACHE']}), "
                     f"GOCACHE ({places['GOCACHE']}); a first build fills about 16 GB there"]
