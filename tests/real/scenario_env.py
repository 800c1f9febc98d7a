"""What every whole-migration scenario under the real CLI shares: three IKS GPU workers on a fresh local control plane
(real scheduler, real DRA allocation, real controllers), the IKS emulator, and a throw-away project."""
import json
import os
import signal
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from kubernetes import client
from pulumi.automation import CommandError

from gpu_migration_local.control_plane import NodeHealth
from gpu_migration_local.env import LocalCluster

from .kube import eventually
from .local_iks import local_iks
from .project import local_config

A, B, C = "10.240.0.11", "10.240.0.12", "10.240.0.13"
WORKERS = {A: "kube-local0001-gpu-00000101", B: "kube-local0001-gpu-00000102", C: "kube-local0001-gpu-00000103"}
PILOT = "migration.example.com/gpu-dra"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
VERIFICATION = "migration.example.com/gpu-verification"
PILOT_STAGES = {A: "dra", B: "device-plugin", C: "ibm-managed"}


def nodes_config(stages: dict[str, str]) -> list[dict]:
    return [{"name": n, "workerId": WORKERS[n], "stage": stages[n]} for n in (A, B, C)]


class Events:
    """Engine events in arrival order: (op, resource name, 'pre'|'done')."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str, str]] = []

    def __call__(self, event) -> None:
        for kind, e in (("pre", event.resource_pre_event), ("done", event.res_outputs_event)):
            if e is not None:
                self.steps.append((e.metadata.op.value, e.metadata.urn.rsplit("::", 1)[1], kind))

    def index(self, name: str, kind: str) -> int:
        return next(i for i, (_, n, k) in enumerate(self.steps) if n == name and k == kind)


@dataclass
class Env:
    cluster: LocalCluster
    iks: object
    project: object
    core: client.CoreV1Api

    def config(self, stages: dict[str, str], **extra) -> dict:
        return local_config(self.cluster, self.iks, nodes_config(stages), **extra)

    def up(self, stages: dict[str, str], **extra):
        self.project.write_stack(self.config(stages, **extra))
        events = Events()
        result = self.project.stack().up(on_output=print, on_event=events)
        assert result.summary.result == "succeeded"
        return result, events

    def node(self, name: str) -> client.V1Node:
        return self.core.read_node(name)

    def record(self, name: str) -> dict:
        return json.loads(self.node(name).metadata.annotations[VERIFICATION])


def three_workers(project, node_health: NodeHealth = NodeHealth()):
    """A fresh cluster with the three IKS GPU workers registered as nodes, the IKS emulator and the project."""
    with LocalCluster(node_health=node_health) as cluster, local_iks(cluster, WORKERS) as iks:
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == 3, "three IKS GPU nodes registered")
        yield Env(cluster, iks, project, core)


def new_name(result, node: str) -> str:
    return result.outputs[f"node:{node}"].value["nodeName"]


def processes() -> dict[int, tuple[int, list[bytes]]]:
    """{pid: (parent pid, argv)} of every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        found[int(entry)] = (ppid, argv)
    return found


def cli_processes() -> list[int]:
    """PIDs of `pulumi up` processes started by this test process (the Automation API's CLI)."""
    return [pid for pid, (ppid, argv) in processes().items()
            if ppid == os.getpid() and argv and argv[0].endswith(b"/pulumi") and b"up" in argv]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the CLI's language host and provider plugins)."""
    table, found, frontier = processes(), [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, (ppid, _) in table.items() if ppid == parent]
        found += children
        frontier += children
    return found


def interrupted_up(stack, when: Callable[[], object], what: str, signal_name: str = "SIGINT",
                   timeout: float = 180, plugins: Optional[list[int]] = None) -> CommandError:
    """Run `pulumi up` in the background, send `signal_name` to the CLI once `when()` is truthy, and return the
    error the interrupted `up` ended with (it must end with one). `plugins` receives the PIDs of the CLI's plugin
    processes at that moment (a SIGKILL leaves them running)."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = stack.up(on_output=print)
        except CommandError as e:
            outcome["error"] = e

    t = threading.Thread(target=run)
    t.start()
    eventually(when, what, timeout=timeout, interval=0.05)
    for pid in eventually(cli_processes, "the pulumi up process"):
        if plugins is not None:
            plugins += descendants(pid)
        os.kill(pid, getattr(signal, signal_name))
    t.join(timeout=timeout)
    assert not t.is_alive() and "error" in outcome, outcome
    return outcome["error"]
