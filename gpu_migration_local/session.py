"""A local environment that stays up between commands, for rehearsing what you will type against IKS.

    venv/bin/python -m gpu_migration_local start            # in a terminal of its own (or with &); Ctrl-C or `stop` ends it
    eval "$(venv/bin/python -m gpu_migration_local env)"     # this shell: pulumi, kubectl and status reach it
    venv/bin/python -m gpu_migration_local pulumi up --stack local
    venv/bin/python -m gpu_migration_local stop

`start` runs the control plane, the GPU doubles and the IKS emulator (seeded from Pulumi.<stack>.yaml: the master and
every listed GPU worker at 1.35, as before a migration) in one process until `stop`, so the cluster, the emulator's
workers and the stack state (a file backend in .local/backend) carry over from one command to the next. It records
what the other commands need in .local/session.json (its pid and the environment: backend, passphrase, the
emulator's API key, the kubeconfig). A new `start` begins afresh: the emulator's state lives in the process, so a
stopped session's cluster and stack state could not match the next one's.
"""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import yaml

from . import tools
from .control_plane import write_private
from .engine import PASSPHRASE, Engine
from .env import LocalCluster
from .iks_emulator import IksEmulator
from .iks_nodes import IksNodeSync

REPO = pathlib.Path(__file__).resolve().parents[1]
STOP_TIMEOUT = 60.0  # seconds `stop` waits for the session to end


class SessionError(RuntimeError):
    """A session command cannot run; the message says what to do."""


@dataclass(frozen=True)
class Paths:
    """Where a project's session lives: <project>/.local (git-ignored)."""
    project: pathlib.Path

    @property
    def state(self) -> pathlib.Path:
        return self.project / ".local"

    @property
    def session(self) -> pathlib.Path:
        return self.state / "session.json"

    @property
    def backend(self) -> pathlib.Path:
        return self.state / "backend"

    def stack_file(self, stack: str) -> pathlib.Path:
        return self.project / f"Pulumi.{stack}.yaml"


def stack_config(paths: Paths, stack: str) -> dict:
    path = paths.stack_file(stack)
    if not path.exists():
        raise SessionError(f"no stack file {path}: the local environment runs a stack whose endpoints point at "
                           f"127.0.0.1 (Pulumi.local.yaml)")
    return yaml.safe_load(path.read_text())["config"]


def seed(iks: IksEmulator, config: dict) -> None:
    """The cluster of the stack file as it is before the migration: master and GPU workers at 1.35."""
    import itertools
    for node in config["gpu-migration:nodes"]:
        worker = iks.add_worker(pool_name="gpu", version="1.35.4_1540", worker_id=node["workerId"])
        worker["networkInterfaces"][0]["ipAddress"] = node["name"]
    # New workers get 10.240.0.(n % 250 + 2) from this counter, shared with IAM tokens: from 1020 that is .22 upwards
    # for 230 draws, never a configured name (.11-.13); from 1000 the ninth draw was .11 (tests/real/local_iks.py).
    iks._ids = itertools.count(1020)


def link_charts(state: pathlib.Path) -> pathlib.Path:
    """.local/charts/gpu-operator: the real GPU Operator chart tools/build took from its module, where
    Pulumi.local.yaml's gpuOperator.chart points (the tools cache's path differs per machine and pin)."""
    link = state / "charts" / "gpu-operator"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(tools.gpu_operator_chart(), target_is_directory=True)
    return link


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_session(paths: Paths) -> Optional[dict]:
    """The running session's record, or None (no record, or its process is gone)."""
    try:
        record = json.loads(paths.session.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record if alive(int(record.get("pid", 0))) else None


def require_session(paths: Paths) -> dict:
    record = read_session(paths)
    if record is None:
        raise SessionError("no local environment is running: start it with `venv/bin/python -m gpu_migration_local "
                           "start` (in a terminal of its own, or with &)")
    return record


def session_env(record: dict) -> dict[str, str]:
    """The environment of every command against the session: the real tools' (tools.engine_env) and the session's."""
    return {**tools.engine_env(), **record["env"]}


def shell_exports(record: dict) -> str:
    """`export K=V` lines for a shell: the pulumi CLI on PATH, the backend and passphrase, the kubeconfig."""
    env = {**record["env"],
           "PATH": os.pathsep.join([str(tools.bin_dir()), str(pathlib.Path(sys.executable).parent),
                                    os.environ.get("PATH", "")])}
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


class Session:
    """What `start` runs until it is stopped."""

    def __init__(self, paths: Paths, stack: str, say: Callable[[str], None] = print):
        self.paths, self.stack, self.say = paths, stack, say
        self.config = stack_config(paths, stack)
        self.stopping = threading.Event()

    def run(self, first: Optional[Callable[[Engine], int]] = None, stay: bool = True) -> int:
        """Start everything; run `first` (the demo's `pulumi up`) if given; with `stay`, keep running until stopped.
        Returns `first`'s exit code (0 without it)."""
        if read_session(self.paths) is not None:
            pid = json.loads(self.paths.session.read_text())["pid"]
            raise SessionError(f"a local environment already runs (pid {pid}); stop it first: "
                               f"venv/bin/python -m gpu_migration_local stop")
        port = self._emulator_port()
        self.say("building or finding the tools (tools/build; minutes when cold)...")
        self.say(f"tools: {tools.versions_line()}")
        for stale in (self.paths.state / "cluster", self.paths.backend, self.paths.session):
            if stale.exists():  # an earlier session's: see the module docstring
                self.say(f"removing {stale} of an earlier run (a fresh IKS emulator starts with every run)")
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        self.paths.state.mkdir(exist_ok=True)
        self.paths.state.chmod(0o700)  # the cluster's credentials and the kubeconfig live below it
        link_charts(self.paths.state)
        cluster = LocalCluster(workdir=self.paths.state / "cluster", keep_workdir=True)
        (self.paths.state / "cluster").mkdir(parents=True, exist_ok=True)
        iks = IksEmulator(cluster=self.config["gpu-migration:clusterName"], port=port)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stopping.set())
        try:
            with cluster:
                iks.start()
                sync = IksNodeSync(iks, cluster.api_client, cluster.cache).start()
                try:
                    seed(iks, self.config)
                    engine = self._record(cluster, iks)
                    code = first(engine) if first is not None else 0
                    if stay:
                        self.say(self._ready_text())
                        self.stopping.wait()
                        self.say("stopping the local environment...")
                finally:
                    sync.stop()
                    iks.stop()
        finally:
            self.paths.session.unlink(missing_ok=True)  # last: `stop` waits for it
        self.say("the local environment is stopped")
        return code

    def _emulator_port(self) -> int:
        """The IKS emulator's port, from the stack's gpu-migration:ibmCloud.endpoint (http://127.0.0.1:<port>)."""
        endpoint = str((self.config.get("gpu-migration:ibmCloud") or {}).get("endpoint", ""))
        host, _, port = endpoint.removeprefix("http://").split("/")[0].partition(":")
        if host not in ("127.0.0.1", "localhost") or not port.isdigit():
            raise SessionError(
                f"Pulumi.{self.stack}.yaml: gpu-migration:ibmCloud.endpoint is {endpoint or 'not set'}, not the "
                f"local IKS emulator (http://127.0.0.1:<port>): the local environment runs a stack like "
                f"Pulumi.local.yaml, never one that points at IBM Cloud")
        return int(port)

    def _record(self, cluster: LocalCluster, iks: IksEmulator) -> Engine:
        kubeconfig = self.paths.project / self.config["gpu-migration:kubeconfig"]
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        write_private(kubeconfig, cluster.kubeconfig.read_text())
        env = {"PULUMI_BACKEND_URL": self.paths.backend.resolve().as_uri(), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
               "IC_API_KEY": iks.api_key, "KUBECONFIG": str(kubeconfig.resolve()),
               "PULUMI_HOME": tools.engine_env()["PULUMI_HOME"], "PULUMI_SKIP_UPDATE_CHECK": "true"}
        engine = Engine(self.paths.project, self.paths.backend, env={"IC_API_KEY": iks.api_key})
        engine.stack(self.stack)  # `pulumi stack init`, so every command finds it
        # `pulumi`: the CLI `status` uses for the stack outputs (iks_gpu_migration/cli/status.py local_session_cli).
        write_private(self.paths.session, json.dumps({"pid": os.getpid(), "stack": self.stack, "env": env,
                                                      "pulumi": str(tools.bin_dir() / "pulumi")}))
        return engine

    def _ready_text(self) -> str:
        """The commands that reach this session, runnable as printed from the repository (a `--project` session
        names its project in each)."""
        s = self.stack
        py = str(pathlib.Path(sys.executable).parent / "python") if self.paths.project != REPO else "venv/bin/python"
        project = f" --project {self.paths.project}" if self.paths.project != REPO else ""
        local = f"{py} -m gpu_migration_local{project}"
        status_dir = f" --project-dir {self.paths.project}" if project else ""
        return (f"\nThe local environment is up (stack {s}, IKS emulator on "
                f"{self.config['gpu-migration:ibmCloud']['endpoint']}). In another shell, in {REPO}:\n"
                f"  eval \"$({local} env)\"   # this shell: pulumi on PATH, the stack's backend, KUBECONFIG\n"
                f"  {local} pulumi preview --stack {s}\n"
                f"  {local} pulumi up --stack {s}\n"
                f"  {py} -m iks_gpu_migration.cli.status --stack {s}{status_dir}\n"
                f"  pulumi stack history --stack {s}\n"
                f"  {py} -m iks_gpu_migration.cli.recover --stack {s}{status_dir}   # after a killed up\n"
                f"  kubectl get nodes -L nvidia.com/gpu.deploy.device-plugin   # with your kubectl\n"
                f"Edit Pulumi.{s}.yaml and run `up` again to expand the pilot or roll back "
                f"(docs/operations.md#rehearse-locally).\n"
                f"Stop it with Ctrl-C here or `{local} stop`.")


def stop(paths: Paths, say: Callable[[str], None] = print, timeout: float = STOP_TIMEOUT) -> int:
    record = require_session(paths)
    pid = int(record["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while paths.session.exists() and alive(pid):  # the session removes its record once everything stopped
        if time.monotonic() > deadline:
            raise SessionError(f"the local environment (pid {pid}) did not stop within {timeout:.0f}s; end it with "
                               f"`kill {pid}`")
        time.sleep(0.2)
    say(f"stopped the local environment (pid {pid})")
    return 0
