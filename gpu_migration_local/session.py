"""A local environment that stays up between commands, for rehearsing what you will type against IKS.

    venv/bin/python -m gpu_migration_local start            # in a terminal of its own (or with &); Ctrl-C or `stop` ends it
    eval "$(venv/bin/python -m gpu_migration_local env)"     # this shell: pulumi, kubectl and status reach it
    pulumi up --stack local                                  # the session's pulumi (.local/bin/pulumi, pulumi_cli.py)
    venv/bin/python -m gpu_migration_local stop

`start` runs the control plane, the GPU doubles and the IKS emulator (seeded from Pulumi.<stack>.yaml: the master and
every listed GPU worker at 1.35, as before a migration) in one process until `stop`, so the cluster, the emulator's
workers and the stack state (a file backend in .local/backend) carry over from one command to the next. It records
what the other commands need in .local/session.json (its pid, the ports it took, the emulator's URL and the
environment: backend, passphrase, the emulator's API key, the kubeconfig). A new `start` begins afresh: the emulator's
state lives in the process, so a stopped session's cluster and stack state could not match the next one's.

One environment per project, any number per machine: every port is the kernel's pick of a free one on 127.0.0.1 (the
stack file's endpoints say only http://127.0.0.1; the program gets the session's URL: engine.session_config), and a
second `start` of the same project is refused while the first holds .local/session.lock (session_lock.py), before
anything is removed.
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

from . import session_lock, tools
from .control_plane import write_private
from .engine import PASSPHRASE, Engine, is_local_url
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

    @property
    def lock(self) -> pathlib.Path:
        return self.state / "session.lock"  # held by the running session's process (session_lock.py)

    @property
    def bin(self) -> pathlib.Path:
        return self.state / "bin"  # the session's `pulumi` (write_pulumi_wrapper)

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


def read_session(paths: Paths) -> Optional[dict]:
    """The running session's record, or None (none runs, it is still starting, or it was killed: a record without
    the lock's holder is stale)."""
    if not session_lock.held(paths.lock):
        return None
    try:
        return json.loads(paths.session.read_text())
    except (FileNotFoundError, ValueError):
        return None


def local_command(paths: Paths) -> tuple[str, str]:
    """(python, `python -m gpu_migration_local` of this project) as the user types them in the repository."""
    if paths.project == REPO:
        return "venv/bin/python", "venv/bin/python -m gpu_migration_local"
    py = str(pathlib.Path(sys.executable).parent / "python")
    return py, f"{py} -m gpu_migration_local --project {shlex.quote(str(paths.project))}"


def require_session(paths: Paths) -> dict:
    record = read_session(paths)
    if record is None:
        local = local_command(paths)[1]
        pid = session_lock.holder(paths.lock)
        if pid is not None:
            raise SessionError(f"the local environment (pid {pid}) is still starting: wait for its line \"The local "
                               f"environment is up\" (or stop it: `{local} stop`)")
        raise SessionError(f"no local environment is running: start it with `{local} start` (in a terminal of its "
                           f"own, or with &)")
    return record


def session_env(record: dict) -> dict[str, str]:
    """The environment of every command against the session: the real tools' (tools.engine_env) and the session's."""
    return {**tools.engine_env(), **record["env"]}


def shell_exports(record: dict) -> str:
    """`export K=V` lines for a shell: the session's `pulumi` first on PATH (write_pulumi_wrapper), the backend and
    passphrase, the kubeconfig."""
    env = {**record["env"],
           "PATH": os.pathsep.join([record["bin"], str(pathlib.Path(sys.executable).parent),
                                    os.environ.get("PATH", "")])}
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def write_pulumi_wrapper(paths: Paths) -> pathlib.Path:
    """.local/bin/pulumi: `python -m gpu_migration_local pulumi` under the name `pulumi`, so after the `eval` of `env`
    a plain `pulumi preview --stack local` works as it will against IKS (the bare CLI has no Python language host
    here: pulumi_cli.py). `-P` and PYTHONPATH: this checkout's code, whatever the current directory holds."""
    script = paths.bin / "pulumi"
    script.parent.mkdir(parents=True, exist_ok=True)
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    script.write_text(f"#!/bin/sh\n# The local environment's pulumi (gpu_migration_local/session.py)\n"
                      f"PYTHONPATH={q(REPO)}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PYTHONPATH\n"
                      f"exec {q(sys.executable)} -P -m gpu_migration_local --project {q(paths.project)} "
                      f"pulumi \"$@\"\n")
    script.chmod(0o700)
    return script


class Session:
    """What `start` runs until it is stopped."""

    def __init__(self, paths: Paths, stack: str, say: Callable[[str], None] = print):
        self.paths, self.stack, self.say = paths, stack, say
        self.config = stack_config(paths, stack)
        self.stopping = threading.Event()

    def run(self, first: Optional[Callable[[Engine], int]] = None, stay: bool = True) -> int:
        """Start everything; run `first` (the demo's `pulumi up`) if given; with `stay`, keep running until stopped.
        Returns `first`'s exit code (0 without it). Refused before anything is touched if the stack is not a local
        one or a session of this project runs."""
        self._check_local()
        lock = self._claim()
        try:
            return self._run(first, stay)
        finally:
            lock.close()  # the next `start` may begin (the kernel would drop it with the process anyway)

    def _run(self, first: Optional[Callable[[Engine], int]], stay: bool) -> int:
        self.say("building or finding the tools (tools/build; minutes when cold)...")
        self.say(f"tools: {tools.versions_line()}")
        for stale in (self.paths.state / "cluster", self.paths.backend, self.paths.session):
            if stale.exists():  # an earlier session's: see the module docstring
                self.say(f"removing {stale} of an earlier run (a fresh IKS emulator starts with every run)")
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        self.paths.state.chmod(0o700)  # the cluster's credentials and the kubeconfig live below it
        link_charts(self.paths.state)
        cluster = LocalCluster(workdir=self.paths.state / "cluster", keep_workdir=True)
        (self.paths.state / "cluster").mkdir(parents=True, exist_ok=True)
        if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.stopping.set())
        try:
            with cluster:
                # Port 0: the kernel's pick of a free port, bound at once, so environments of other clones (or a
                # test's) run side by side; the program gets the URL from the session (engine.session_config).
                iks = IksEmulator(cluster=self.config["gpu-migration:clusterName"], port=0).start()
                sync = IksNodeSync(iks, cluster.api_client, cluster.cache).start()
                try:
                    seed(iks, self.config)
                    engine = self._record(cluster, iks)
                    code = first(engine) if first is not None else 0
                    if stay:
                        self.say(self._ready_text(iks.url))
                        self.stopping.wait()
                        self.say("stopping the local environment...")
                finally:
                    sync.stop()
                    iks.stop()
        finally:
            self.paths.session.unlink(missing_ok=True)
        self.say("the local environment is stopped")
        return code

    def _check_local(self) -> None:
        """Both IBM Cloud endpoints of the stack must be local (http://127.0.0.1): the session puts its emulator's URL
        in their place, and never runs a stack that points at IBM Cloud."""
        ibm = self.config.get("gpu-migration:ibmCloud") or {}
        for key in ("endpoint", "iamEndpoint"):
            value = str(ibm.get(key, "") if isinstance(ibm, dict) else "")
            if not is_local_url(value):
                raise SessionError(
                    f"Pulumi.{self.stack}.yaml: gpu-migration:ibmCloud.{key} is {value or 'not set'}, not the local "
                    f"IKS emulator (http://127.0.0.1; the session picks its port): the local environment runs a "
                    f"stack like Pulumi.local.yaml, never one that points at IBM Cloud")

    def _claim(self):
        """This project's session lock (session_lock.py), or the error naming the session that holds it."""
        try:
            return session_lock.claim(self.paths.lock)
        except session_lock.Taken as e:
            local = local_command(self.paths)[1]
            raise SessionError(f"a local environment of {self.paths.project} already runs (pid {e.pid or '?'}): "
                               f"use it (`eval \"$({local} env)\"`) or stop it first with `{local} stop` (or "
                               f"`kill {e.pid or '<pid>'}`); nothing was changed") from None

    def _record(self, cluster: LocalCluster, iks: IksEmulator) -> Engine:
        kubeconfig = self.paths.project / self.config["gpu-migration:kubeconfig"]
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        write_private(kubeconfig, cluster.kubeconfig.read_text())
        env = {"PULUMI_BACKEND_URL": self.paths.backend.resolve().as_uri(), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
               "IC_API_KEY": iks.api_key, "KUBECONFIG": str(kubeconfig.resolve()),
               "PULUMI_HOME": tools.engine_env()["PULUMI_HOME"], "PULUMI_SKIP_UPDATE_CHECK": "true"}
        engine = Engine(self.paths.project, self.paths.backend, env={"IC_API_KEY": iks.api_key},
                        iks_endpoint=iks.url)
        engine.stack(self.stack)  # `pulumi stack init`, so every command finds it
        write_pulumi_wrapper(self.paths)
        assert cluster.control_plane is not None and cluster.log_server is not None
        ports = {"iks": int(iks.url.rsplit(":", 1)[1]), "apiserver": cluster.control_plane.apiserver_port,
                 "kubeletLogs": cluster.log_server.port}
        # `pulumi`: the CLI `status` uses for the stack outputs (iks_gpu_migration/cli/status.py local_session_cli);
        # iksEndpoint: what pulumi_cli.py gives the program in place of the stack file's endpoints.
        write_private(self.paths.session, json.dumps({
            "pid": os.getpid(), "stack": self.stack, "project": str(self.paths.project), "iksEndpoint": iks.url,
            "ports": ports, "env": env, "pulumi": str(tools.bin_dir() / "pulumi"), "bin": str(self.paths.bin)}))
        return engine

    def _ready_text(self, iks_url: str) -> str:
        """The commands that reach this session, runnable as printed from the repository (a `--project` session
        names its project in each)."""
        s = self.stack
        py, local = local_command(self.paths)
        status_dir = f" --project-dir {shlex.quote(str(self.paths.project))}" if self.paths.project != REPO else ""
        return (f"\nThe local environment is up (stack {s}, IKS emulator on {iks_url}). In another shell, in {REPO}:\n"
                f"  eval \"$({local} env)\"   # this shell: the session's pulumi on PATH, its backend, KUBECONFIG\n"
                f"  pulumi preview --stack {s}\n"
                f"  pulumi up --stack {s}\n"
                f"  {py} -m iks_gpu_migration.cli.status --stack {s}{status_dir}\n"
                f"  pulumi stack history --stack {s}\n"
                f"  {py} -m iks_gpu_migration.cli.recover --stack {s}{status_dir}   # after a killed up\n"
                f"  kubectl get nodes -L nvidia.com/gpu.deploy.device-plugin   # with your kubectl\n"
                f"Without the eval, `{local} pulumi <arguments>` is the same pulumi.\n"
                f"Edit Pulumi.{s}.yaml and run `up` again to expand the pilot or roll back "
                f"(docs/operations.md#rehearse-locally).\n"
                f"Stop it with Ctrl-C here or `{local} stop`.")


def stop(paths: Paths, say: Callable[[str], None] = print, timeout: float = STOP_TIMEOUT) -> int:
    """Ends the project's session (also one still starting); with none running, says so and succeeds."""
    pid = session_lock.holder(paths.lock)
    if pid is None:
        say(f"no local environment of {paths.project} is running: nothing to stop")
        return 0
    if not pid:  # it holds the lock but has not written its pid yet: a moment
        time.sleep(0.5)
        pid = session_lock.holder(paths.lock) or 0
    if pid:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while session_lock.held(paths.lock):  # released when the process ends, after it removed its record
        if time.monotonic() > deadline:
            raise SessionError(f"the local environment (pid {pid}) did not stop within {timeout:.0f}s; end it with "
                               f"`kill {pid}`")
        time.sleep(0.2)
    say(f"stopped the local environment (pid {pid})")
    return 0
