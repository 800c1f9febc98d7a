"""The README's rehearsal (issue 19): the commands a platform engineer will type against IKS, typed against a local
environment that stays up between them. Everything through the real commands, each its own process: `start`, `env`
(its exports), plain `pulumi ...` after them and `python -m gpu_migration_local pulumi ...` (the real CLI, every
argument passed through), `status`, `pulumi stack history`, `stop`.

start (a second start of the same project refused, naming its pid, before anything is touched; another project's
environment runs beside it on ports of its own: issue 39) -> a secret set with `pulumi config set --secret` -> up
(Pulumi.local.yaml's stages: one dra node, one device-plugin, one ibm-managed) -> status -> expand the pilot to a
second dra node by editing the stack file (the preview changes only that node's resources) -> up -> status -> roll
back from stack history as the docs give it (`python -m iks_gpu_migration.cli.history` lists the updates, `--restore
1` writes the first one's config back: one line of the stack file changes, the secret stays; plain `pulumi preview`
changes only the expanded node, going back; issue 39 section 1) -> up -> status -> stack history shows the three
updates -> recover's dry run finds nothing to do -> stop (then status and a second stop say none runs)."""
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import threading
import time

import pytest
import yaml

from .project import CHARTS, EVERY_UP_CHECKS, REPO

PY = sys.executable
PY_DIR = pathlib.Path(sys.executable).parent
DRA = "10.240.0.11"  # the stack file's dra node
EXPANDED = "10.240.0.12"  # the pilot's second dra node
START_TIMEOUT = 300  # the tools are built by then (the session fixtures build them first)


def copy_project(d: pathlib.Path) -> pathlib.Path:
    """A copy of the project with Pulumi.local.yaml as it is (the operator chart where `start` links it, the
    emulator's endpoint without a port: the session picks one), the DRA stand-in by absolute path."""
    d.mkdir()
    shutil.copy(REPO / "Pulumi.yaml", d / "Pulumi.yaml")
    text = (REPO / "Pulumi.local.yaml").read_text()
    stack = yaml.safe_load(text)
    cfg = stack["config"]
    cfg["gpu-migration:draDriver"]["chart"] = str(CHARTS / "nvidia-dra-driver-gpu")
    cfg["gpu-migration:timeouts"]["pollInterval"] = 0.2
    (d / "Pulumi.local.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    return d


@pytest.fixture
def project_dir(tmp_path):
    return copy_project(tmp_path / "project")


class Started:
    """`start` of a project in its own process, its output read as it comes (a full pipe would block it)."""

    def __init__(self, project: pathlib.Path):
        self.process = subprocess.Popen([PY, "-m", "gpu_migration_local", "--project", str(project), "start"],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.seen: list[str] = []
        threading.Thread(target=lambda: self.seen.extend(iter(self.process.stdout.readline, "")), daemon=True).start()

    def wait_up(self) -> str:
        started = time.monotonic()
        while not any("The local environment is up" in line for line in list(self.seen)):
            assert time.monotonic() - started < START_TIMEOUT and self.process.poll() is None, "".join(self.seen)
            time.sleep(0.2)
        return "".join(self.seen)

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)


def record(project: pathlib.Path) -> dict:
    return json.loads((project / ".local" / "session.json").read_text())


def runs_beside(project: pathlib.Path, other_dir: pathlib.Path, other: Started) -> None:
    """Another clone's environment, started beside the running one (issue 39 section 2), comes up on ports of its
    own, recorded in its session; then it stops."""
    other.wait_up()
    mine, theirs = record(project), record(other_dir)
    assert mine["iksEndpoint"] != theirs["iksEndpoint"]
    assert mine["iksEndpoint"] == f"http://127.0.0.1:{mine['ports']['iks']}"
    assert not set(mine["ports"].values()) & set(theirs["ports"].values()), (mine["ports"], theirs["ports"])
    assert local(other_dir, "stop").returncode == 0 and other.process.wait(timeout=60) == 0


def local(project: pathlib.Path, *args: str, env=None, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([PY, "-m", "gpu_migration_local", "--project", str(project), *args], text=True,
                          capture_output=True, timeout=timeout, env=env)
    print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
    return done


def exported(text: str) -> dict[str, str]:
    env = dict(os.environ)
    for line in text.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0] if value else ""
    return env


def with_stage(text: str, node: str, stage: str) -> str:
    stack = yaml.safe_load(text)
    for entry in stack["config"]["gpu-migration:nodes"]:
        if entry["name"] == node:
            entry["stage"] = stage
    return yaml.safe_dump(stack, sort_keys=False)


def history(project: pathlib.Path, env: dict) -> list[dict]:
    """`pulumi stack history` run as the session prints it (the CLI from the exported PATH), newest first."""
    done = subprocess.run(["pulumi", "stack", "history", "--stack", "local", "--json"], cwd=project, env=env,
                          text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def status(project: pathlib.Path, env: dict) -> dict[str, dict]:
    done = subprocess.run([PY, "-m", "iks_gpu_migration.cli.status", "--stack", "local", "--project-dir",
                           str(project), "--json"], text=True, capture_output=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert not data["notes"], data["notes"]  # the stack outputs were read: nodes under their replaced names
    return {n["configuredName"]: n for n in data["nodes"]}


def all_done(nodes: dict[str, dict]) -> dict[str, str]:
    return {name: n["stage"] for name, n in nodes.items() if n["steps"] and all(s["done"] for s in n["steps"])}


def preview_changes(stdout: str) -> set[str]:
    """What a `pulumi preview --json` changes: resource names, without providers and the checks every up runs."""
    return {s["urn"].rsplit("::", 1)[1] for s in json.loads(stdout)["steps"]
            if s["op"] != "same" and not s["urn"].split("::")[2].startswith("pulumi:providers:")} - EVERY_UP_CHECKS


def expand(project_dir: pathlib.Path, stack_file: pathlib.Path) -> set[str]:
    """The pilot expanded to a second dra node by editing the stack file: its preview changes only that node's
    resources, its gate and DRA preflight among them (the DRA path is there already); then up. Returns what the
    preview changed."""
    stack_file.write_text(with_stage(stack_file.read_text(), EXPANDED, "dra"))
    preview = local(project_dir, "pulumi", "preview", "--stack", "local", "--json")
    assert preview.returncode == 0, preview.stderr
    changed = preview_changes(preview.stdout)
    assert f"{EXPANDED}-switch" in changed, sorted(changed)
    assert all(EXPANDED in name for name in changed), sorted(changed)
    assert local(project_dir, "pulumi", "up", "--stack", "local", "--yes").returncode == 0
    return changed


def history_command(project: pathlib.Path, env: dict, *args: str) -> str:
    done = subprocess.run([PY, "-m", "iks_gpu_migration.cli.history", "--stack", "local", "--project-dir",
                           str(project), *args], text=True, capture_output=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def roll_back_from_history(project_dir: pathlib.Path, env: dict, expanded: set[str]) -> None:
    """docs/operations.md#rollback: the history command lists the updates (the stack file matches the newest),
    `--restore 1` writes the first one's config back: one line changes, the secret's ciphertext stays; plain `pulumi
    preview` after the eval (issue 39 section 3) changes only the expanded node, going back."""
    raw = history(project_dir, env)
    assert [u["result"] for u in raw] == ["succeeded"] * 2
    assert raw[0]["config"]["gpu-migration:ibmApiKey"] == {"secret": True}  # the CLI shows no secret's value
    listed = json.loads(history_command(project_dir, dict(os.environ), "--json"))["updates"]  # no `eval` needed
    assert [(u["number"], u["stages"], u["matchesStackFile"]) for u in listed] == [
        (2, {DRA: "dra", EXPANDED: "dra", "10.240.0.13": "ibm-managed"}, True),
        (1, {DRA: "dra", EXPANDED: "device-plugin", "10.240.0.13": "ibm-managed"}, False)]
    stack_file = project_dir / "Pulumi.local.yaml"
    before = stack_file.read_text()
    out = history_command(project_dir, env, "--restore", "1").splitlines()
    assert len(out) == 3 and out[1] == f"  node {EXPANDED}: stage dra -> device-plugin", out  # nothing else changes
    assert out[2].startswith("written: Pulumi.local.yaml holds update #1 "), out
    after = stack_file.read_text()
    assert len(after.splitlines()) == len(before.splitlines()) and [
        (a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b] == [
        ("    stage: dra", "    stage: device-plugin")], after
    back = subprocess.run(["pulumi", "preview", "--stack", "local", "--json"], cwd=project_dir, env=env,
                          text=True, capture_output=True, timeout=300)
    assert back.returncode == 0, back.stderr[-2000:]
    changed = preview_changes(back.stdout)
    assert f"{EXPANDED}-switch" in changed and all(EXPANDED in n or n in expanded for n in changed), sorted(changed)


def test_the_readme_rehearsal_start_up_expand_roll_back_status_stop(project_dir, tmp_path, request):
    request.config.real_engine_nodeids.add(request.node.nodeid)
    started = Started(project_dir)
    other = None
    try:
        out = started.wait_up()
        local_py = f"{PY_DIR}/python -m gpu_migration_local --project {project_dir}"
        assert f"eval \"$({local_py} env)\"" in out and "\n  pulumi preview --stack local\n" in out
        pid = started.process.pid
        again = local(project_dir, "start")
        assert again.returncode == 1 and again.stderr == (
            f"error: a local environment of {project_dir} already runs (pid {pid}): use it (`eval \"$({local_py} "
            f"env)\"`) or stop it first with `{local_py} stop` (or `kill {pid}`); nothing was changed\n")
        assert (project_dir / ".local" / "backend").is_dir() and record(project_dir)["pid"] == pid

        other = Started(copy_project(tmp_path / "other-clone"))
        runs_beside(project_dir, tmp_path / "other-clone", other)

        env = exported(local(project_dir, "env").stdout)
        secret = subprocess.run(["pulumi", "config", "set", "--secret", "gpu-migration:ibmApiKey", env["IC_API_KEY"],
                                 "--stack", "local"], cwd=project_dir, env=env, text=True, capture_output=True,
                                timeout=120)  # a secret in the stack file, which restoring an update keeps
        assert secret.returncode == 0, secret.stderr

        up = local(project_dir, "pulumi", "up", "--stack", "local", "--yes")
        assert up.returncode == 0
        assert "--parallel" not in up.stdout + up.stderr  # the wrapper passes a --parallel that needs no warning
        first = status(project_dir, dict(os.environ))  # out of the box: no `eval` of the session's environment
        assert set(all_done(first)) == set(first) == {DRA, "10.240.0.12", "10.240.0.13"}, first
        pilot_node = first[EXPANDED]["node"]
        assert first[DRA]["stage"] == "dra" and pilot_node != EXPANDED  # replaced: status found its new name

        expanded = expand(project_dir, project_dir / "Pulumi.local.yaml")
        now = status(project_dir, env)
        assert now[EXPANDED]["stage"] == "dra" and EXPANDED in all_done(now)
        assert now[EXPANDED]["verification"]["result"] == "passed"

        roll_back_from_history(project_dir, env, expanded)
        assert local(project_dir, "pulumi", "up", "--stack", "local", "--yes").returncode == 0
        back = status(project_dir, env)
        assert back[EXPANDED]["stage"] == "device-plugin" and all_done(back) == all_done(first)
        assert back[EXPANDED]["node"] == pilot_node  # the same worker: a switch back, no replacement
        assert [u["result"] for u in history(project_dir, env)] == ["succeeded"] * 3
        listed = json.loads(history_command(project_dir, env, "--json"))["updates"]
        assert [u["matchesStackFile"] for u in listed] == [True, False, True]  # the rollback ran update #1's config
        recover = subprocess.run([PY, "-m", "iks_gpu_migration.cli.recover", "--stack", "local", "--project-dir",
                                  str(project_dir)], env=env, text=True, capture_output=True, timeout=120)
        assert recover.returncode == 0 and "no pending operations and no lock to remove" in recover.stdout, recover

        assert local(project_dir, "stop").returncode == 0
        assert started.process.wait(timeout=60) == 0
        assert "the local environment is stopped" in "".join(started.seen)
        assert not (project_dir / ".local" / "session.json").exists()
        gone = local(project_dir, "pulumi", "stack", "ls")
        assert gone.returncode == 1 and "no local environment is running" in gone.stderr
        stopped = subprocess.run([PY, "-m", "iks_gpu_migration.cli.status", "--stack", "local", "--project-dir",
                                  str(project_dir)], text=True, capture_output=True, env=env, timeout=120)
        assert stopped.returncode == 1 and stopped.stderr.startswith(
            "error: no local environment is running for stack local: start it with"), stopped.stderr
        second = local(project_dir, "stop")
        assert second.returncode == 0 and "nothing to stop" in second.stdout
    finally:
        started.end()
        if other is not None:
            other.end()
