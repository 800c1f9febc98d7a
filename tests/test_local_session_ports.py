"""One local environment per project, any number per machine (issue 39 section 2): free ports recorded in the
session, a second `start` of the same project refused before anything is touched, a killed session's leftovers never
blocking, the program given the session's emulator, and the commands a user types (the session's `pulumi`, `--help`).
No cluster: the session's own part runs with a stand-in for LocalCluster; the real one in
tests/real/test_rehearsal.py."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest
import yaml

from gpu_migration_local import session, session_lock
from gpu_migration_local.engine import session_config

PY = f"{pathlib.Path(sys.executable).parent}/python"  # as local_command prints it


def local_project(path: pathlib.Path, endpoint: str = "http://127.0.0.1") -> session.Paths:
    path.mkdir(parents=True)
    stack = yaml.safe_load((session.REPO / "Pulumi.local.yaml").read_text())
    stack["config"]["gpu-migration:ibmCloud"].update(endpoint=endpoint, iamEndpoint=endpoint)
    (path / "Pulumi.local.yaml").write_text(yaml.safe_dump(stack))
    return session.Paths(path)


def test_a_second_start_of_the_same_project_is_refused_before_anything_is_touched(tmp_path, monkeypatch):
    paths = local_project(tmp_path / "project")
    (paths.backend / "stacks").mkdir(parents=True)
    monkeypatch.setattr(session.tools, "versions_line", lambda: pytest.fail("went on past the running session"))
    running = session_lock.claim(paths.lock)  # the running session: this process
    try:
        with pytest.raises(session.SessionError) as e:
            session.Session(paths, "local", say=lambda line: None).run()
    finally:
        running.close()
    local = f"{PY} -m gpu_migration_local --project {paths.project}"
    assert str(e.value) == (f"a local environment of {paths.project} already runs (pid {os.getpid()}): use it "
                            f"(`eval \"$({local} env)\"`) or stop it first with `{local} stop` (or `kill "
                            f"{os.getpid()}`); nothing was changed")
    assert (paths.backend / "stacks").is_dir()


def test_a_stale_lock_of_a_killed_session_never_blocks(tmp_path):
    lock = tmp_path / ".local" / "session.lock"
    lock.parent.mkdir()
    lock.write_text("4194304")  # a pid that is gone; nobody holds the lock
    held = session_lock.claim(lock)
    try:
        assert lock.read_text() == str(os.getpid()) and session_lock.holder(lock) == os.getpid()
    finally:
        held.close()
    assert session_lock.holder(lock) is None


def test_stop_ends_a_session_that_is_still_starting(tmp_path):
    """Holding the lock without a record yet (e.g. while the tools build): `env` says so, `stop` ends it."""
    paths = session.Paths(tmp_path)
    code = ("import pathlib, sys, time; from gpu_migration_local import session_lock; "
            "lock = session_lock.claim(pathlib.Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(paths.lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(session.SessionError, match=rf"the local environment \(pid {holder.pid}\) is still "):
            session.require_session(paths)
        said = []
        assert session.stop(paths, say=said.append, timeout=20) == 0
        assert said == [f"stopped the local environment (pid {holder.pid})"]
        assert holder.wait(timeout=10) == -signal.SIGTERM
    finally:
        holder.kill()
        holder.wait()


class FakeCluster:
    """LocalCluster's surface that Session uses, without processes: what is tested is the session's own part."""

    def __init__(self, workdir: pathlib.Path, keep_workdir: bool):
        self.kubeconfig = workdir / "kubeconfig"
        self.control_plane, self.log_server = SimpleNamespace(apiserver_port=1), SimpleNamespace(port=2)
        self.api_client = self.cache = None

    def __enter__(self):
        self.kubeconfig.write_text("{}")
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture
def no_cluster(monkeypatch, tmp_path):
    monkeypatch.setattr(session, "LocalCluster", FakeCluster)
    monkeypatch.setattr(session, "IksNodeSync", lambda *a: SimpleNamespace(
        start=lambda: SimpleNamespace(stop=lambda: None)))
    monkeypatch.setattr(session, "Engine", lambda *a, **k: SimpleNamespace(stack=lambda name: None))
    monkeypatch.setattr(session, "link_charts", lambda state: None)
    monkeypatch.setattr(session.tools, "versions_line", lambda: "stand-in")
    monkeypatch.setattr(session.tools, "engine_env", lambda: {"PULUMI_HOME": str(tmp_path / "home")})
    monkeypatch.setattr(session.tools, "bin_dir", lambda: tmp_path / "tools")


def test_environments_of_two_projects_run_side_by_side_on_ports_of_their_own(tmp_path, no_cluster):
    """Each session's IKS emulator on a free port it records; the stack file's port (here one another socket holds,
    as a demo once held the old fixed 18480) is never bound."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = f"http://127.0.0.1:{taken.getsockname()[1]}"
        runs = [session.Session(local_project(tmp_path / name, held), "local", say=lambda line: None)
                for name in ("clone-a", "clone-b")]
        codes: list = []
        threads = [threading.Thread(target=lambda r=r: codes.append(r.run())) for r in runs]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 30
            while not all(r.paths.session.exists() for r in runs):
                assert time.monotonic() < deadline and all(t.is_alive() for t in threads), "a session ended"
                time.sleep(0.05)
            records = [session.require_session(r.paths) for r in runs]
            for record in records:
                assert record["iksEndpoint"] == f"http://127.0.0.1:{record['ports']['iks']}" != held
                assert record["ports"]["apiserver"] == 1 and record["ports"]["kubeletLogs"] == 2
                # The session's own emulator answers there, to the API key it recorded.
                form = urllib.parse.urlencode({"grant_type": "urn:ibm:params:oauth:grant-type:apikey",
                                               "apikey": record["env"]["IC_API_KEY"]}).encode()
                with urllib.request.urlopen(f"{record['iksEndpoint']}/identity/token", form, timeout=5) as answer:
                    assert "access_token" in json.load(answer)
            assert records[0]["ports"]["iks"] != records[1]["ports"]["iks"]
        finally:
            for r in runs:
                r.stopping.set()
            for t in threads:
                t.join(timeout=30)
    assert codes == [0, 0]
    assert not any(r.paths.session.exists() or session_lock.held(r.paths.lock) for r in runs)


def test_the_program_gets_the_session_endpoint_in_place_of_local_ones_only():
    local = {"gpu-migration:ibmCloud": json.dumps({"endpoint": "http://127.0.0.1", "iamEndpoint": "http://localhost:9",
                                                   "allowCustomEndpoints": True}), "gpu-migration:x": "1"}
    assert {k: json.loads(v) for k, v in session_config(local, "http://127.0.0.1:4711").items()} == {
        "gpu-migration:ibmCloud": {"endpoint": "http://127.0.0.1:4711", "iamEndpoint": "http://127.0.0.1:4711",
                                   "allowCustomEndpoints": True}}
    ibm = {"gpu-migration:ibmCloud": json.dumps({"endpoint": "https://containers.cloud.ibm.com/global",
                                                 "iamEndpoint": "https://iam.cloud.ibm.com"})}
    assert session_config(ibm, "http://127.0.0.1:4711") == {}  # never away from IBM Cloud
    assert session_config({}, "http://x") == {} == session_config({"gpu-migration:ibmCloud": "no json"}, "http://x")


def test_the_session_pulumi_is_the_wrapper_from_any_directory(tmp_path):
    """.local/bin/pulumi (first on PATH after the `eval`) runs `python -m gpu_migration_local --project P pulumi` with
    this checkout's code wherever the shell is; without a session it says how to start one."""
    paths = session.Paths(tmp_path / "project")
    script = session.write_pulumi_wrapper(paths)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "gpu_migration_local").mkdir(parents=True)  # a package of the same name in the current directory
    (elsewhere / "gpu_migration_local" / "__main__.py").write_text("raise SystemExit('the wrong checkout')\n")
    done = subprocess.run([str(script), "preview", "--stack", "local"], cwd=elsewhere, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 1, done
    assert (f"no local environment is running: start it with `{PY} -m gpu_migration_local --project "
            f"{paths.project} start`") in done.stderr, done.stderr


def test_help_describes_every_command(capsys):
    from gpu_migration_local.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for command in ("up, preview", "start", "stop", "env", "pulumi ARGS"):
        assert f"\n  {command} " in out, command
    assert "[--project DIR] stop" in out  # the whole description, not its first line
