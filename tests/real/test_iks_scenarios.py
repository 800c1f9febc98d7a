"""IKS as it really behaves (issue 10), under the real Pulumi CLI and engine: the IKS emulator's workers are kwok Nodes
of a real local control plane; each test gets its own cluster with three IKS GPU workers (the `env` fixture)."""
import pytest
from pulumi.automation import CommandError

from iks_gpu_migration.iks_api import IksClient

from .kube import eventually
from .project import meaningful, planned_changes
from .scenario_env import A, B, C, PILOT, PILOT_STAGES, WORKERS, new_name

REPLACE = ("POST", "/v2/vpc/replaceWorker")


def replaced(result, node: str) -> str:
    return result.outputs[f"node:{node}"].value["replacedWorkerId"]


def replace_calls(env) -> list[str]:
    """Worker IDs of every replaceWorker the emulator received, in order."""
    return list(env.iks.replaced)


def live_worker_in_pool(env, exclude: set[str]) -> dict:
    with env.iks.lock:
        live = [w for w in env.iks.workers.values()
                if w["lifecycle"]["desiredState"] == "deployed" and w["id"] not in exclude]
    assert len(live) == 1, live
    return live[0]


# issue 10 point 11 + refresh: a worker replaced outside Pulumi ---------------------------------------------------
def test_worker_replaced_outside_pulumi_is_followed_after_refresh(env):
    """Someone runs `ibmcloud ks worker replace` on A's migrated worker. `pulumi refresh` sees the recorded worker
    deleted; the next `up` follows it to the worker IKS created (telling it apart from B's migrated worker in the same
    pool and zone by what the program recorded on B's node), replaces nothing, and repairs A's new node."""
    first, _ = env.up(PILOT_STAGES)
    a_worker, b_worker = replaced(first, A), replaced(first, B)
    IksClient.from_api(env.iks.api()).replace_worker(env.iks.cluster_name, a_worker)  # outside Pulumi
    outside = live_worker_in_pool(env, {a_worker, b_worker, WORKERS[C]})
    outside_node = outside["networkInterfaces"][0]["ipAddress"]
    # The emulator advances per request (as IKS would on its own): tick it while the new worker's node registers.
    eventually(lambda: env.iks.tick() or env.node(outside_node), f"node {outside_node} of the outside replacement",
               timeout=60)
    calls = list(replace_calls(env))
    assert calls[-1] == a_worker

    stack = env.project.stack()
    stack.refresh(on_output=print)
    resources = {r["urn"].rsplit("::", 1)[1]: r for r in stack.export_stack().deployment["resources"]}
    assert resources[f"{A}-replacement"]["outputs"]["worker_state"] == "deleted"

    after = stack.up(on_output=print)
    assert after.summary.result == "succeeded"
    assert replace_calls(env) == calls  # no second replaceWorker of any node
    assert replaced(after, A) == outside["id"] and new_name(after, A) == outside_node
    assert replaced(after, B) == b_worker and new_name(after, B) == new_name(first, B)
    # A's new node was brought to its stage: the dra path, smoke-tested.
    assert env.node(outside_node).metadata.labels[PILOT] == "pilot"
    assert env.record(outside_node)["result"] == "passed"
    assert meaningful(planned_changes(stack)) == {}
