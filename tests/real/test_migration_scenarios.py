"""Whole-migration scenarios under the real Pulumi CLI and engine, against the local control plane (real scheduler,
real DRA allocation) and the IKS emulator. Each test gets its own cluster."""
import json

import pytest
from kubernetes import client

from gpu_migration_local.env import LocalCluster
from gpu_migration_local.gpu_doubles import gpu_uuid

from .kube import eventually
from .local_iks import local_iks
from .project import local_config, meaningful, planned_changes

A, B, C = "10.240.0.11", "10.240.0.12", "10.240.0.13"
WORKERS = {A: "kube-local0001-gpu-00000101", B: "kube-local0001-gpu-00000102", C: "kube-local0001-gpu-00000103"}
PILOT = "migration.example.com/gpu-dra"


@pytest.fixture
def fresh_cluster():
    with LocalCluster() as c:
        yield c


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


def test_fresh_up_to_one_dra_node(fresh_cluster, project):
    cluster = fresh_cluster
    core = client.CoreV1Api(cluster.api_client)
    with local_iks(cluster, WORKERS) as iks:
        eventually(lambda: len(core.list_node().items) == 3, "three IKS GPU nodes registered")
        project.write_stack(local_config(cluster, iks, nodes_config({A: "dra", B: "device-plugin", C: "ibm-managed"})))
        stack = project.stack()
        events = Events()
        result = stack.up(on_output=print, on_event=events)
        assert result.summary.result == "succeeded"

        # The master reached 1.37 before any worker was replaced, one minor at a time.
        calls = [(m, p) for m, p in iks.requests if p.startswith("/v1/clusters/") or p == "/v2/vpc/replaceWorker"]
        assert [m for m, _ in calls[:2]] == ["PUT", "PUT"] and calls[2:] and {p for _, p in calls[2:]} == {
            "/v2/vpc/replaceWorker"}, calls
        # The fence came before the operator; replacements ran one at a time.
        assert events.index(f"{A}-fence", "done") < events.index("gpu-operator", "pre")
        assert events.index(f"{B}-fence", "done") < events.index("gpu-operator", "pre")
        first_ready = events.index(f"{A}-operator-ready", "done")
        assert first_ready < events.index(f"{B}-replacement", "pre")

        out = result.outputs
        new_a = out[f"node:{A}"].value["nodeName"]
        assert new_a != A
        labels = core.read_node(new_a).metadata.labels
        assert labels[PILOT] == "pilot" and labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
        # The smoke pod was scheduled by the real scheduler through DRA onto the pilot node and judged on 4 criteria.
        smoke = out[f"node:{A}"].value["smokeTest"]
        assert smoke.startswith("passed") and gpu_uuid(new_a, 0) in smoke, smoke
        record = json.loads(core.read_node(new_a).metadata.annotations["migration.example.com/gpu-verification"])
        assert record["result"] == "passed" and record["gpu"] == gpu_uuid(new_a, 0), record
        assert not core.read_node(new_a).spec.unschedulable  # uncordoned after the smoke test
        # Never one GPU on two paths: the dra node offers no device-plugin GPUs; C keeps IBM's.
        assert (core.read_node(new_a).status.allocatable or {}).get("nvidia.com/gpu", "0") == "0"
        new_b = out[f"node:{B}"].value["nodeName"]
        assert core.read_node(new_b).status.allocatable["nvidia.com/gpu"] == "1"
        assert meaningful(planned_changes(stack)) == {}
