"""What every whole-migration scenario under the real CLI shares: three IKS GPU workers on a fresh local control plane
(real scheduler, real DRA allocation, real controllers), the IKS emulator, and a throw-away project."""
import json
from dataclasses import dataclass

from kubernetes import client

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


def three_workers(project):
    """A fresh cluster with the three IKS GPU workers registered as nodes, the IKS emulator and the project."""
    with LocalCluster() as cluster, local_iks(cluster, WORKERS) as iks:
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == 3, "three IKS GPU nodes registered")
        yield Env(cluster, iks, project, core)


def new_name(result, node: str) -> str:
    return result.outputs[f"node:{node}"].value["nodeName"]
