"""IKS as it really behaves (issue 10), under the real Pulumi CLI and engine: the IKS emulator's workers are kwok Nodes
of a real local control plane; each test gets its own cluster with three IKS GPU workers (the `env` fixture)."""
import pytest
from pulumi.automation import CommandError

from iks_gpu_migration.iks.api import IksClient

from .kube import eventually
from .project import meaningful, planned_changes
from .scenario_env import A, B, C, PILOT, PILOT_STAGES, WORKERS, Events, new_name


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


def state_outputs(stack) -> dict[str, dict]:
    return {r["urn"].rsplit("::", 1)[1]: r.get("outputs") or {} for r in stack.export_stack().deployment["resources"]}


# issue 10 point 2: kubeVersion bump with nodes already migrated --------------------------------------------------
def test_kube_version_bump_replaces_each_migrated_worker_once_from_state(env):
    """1.36 -> 1.37 on a stack whose nodes were migrated at 1.36 (the config still names the first workers): each
    migrated worker is replaced once, by its current ID from state, one node at a time behind its gate and the
    previous node's checks."""
    stages = {A: "device-plugin", B: "device-plugin", C: "ibm-managed"}
    first, _ = env.up(stages, kubeVersion="1.36")
    migrated = {n: replaced(first, n) for n in (A, B)}
    assert all(env.iks.workers[w]["kubeVersion"]["actual"].startswith("1.36.") for w in migrated.values())
    before = len(replace_calls(env))

    second, events = env.up(stages, kubeVersion="1.37")  # the config is not renamed
    assert replace_calls(env)[before:] == [migrated[A], migrated[B]]  # current IDs, once each, in order
    assert len(set(replace_calls(env))) == len(replace_calls(env))  # no worker was ever replaced twice
    # One node at a time: B's gate re-ran (kubeVersion changed) after A's last check, and B's worker went after it.
    assert events.index(f"{A}-switch", "done") < events.index(f"{B}-gate", "pre") \
        < events.index(f"{B}-replacement", "pre")
    assert events.index(f"{A}-gate", "done") < events.index(f"{A}-replacement", "pre")
    for gate in (f"{A}-gate", f"{B}-gate"):  # each gate counted capacity again, not just its old record
        assert "create-replacement" in {op for op, n, _ in events.steps if n == gate}, events.steps
    outputs = state_outputs(env.project.stack())
    for n in (A, B):
        outs = outputs[f"{n}-replacement"]
        assert outs["old_worker_id"] == migrated[n] and outs["new_worker_id"] == replaced(second, n)
        assert outs["actual_version"].startswith("1.37.")
        node = env.node(new_name(second, n))
        assert node.status.node_info.kubelet_version.startswith("v1.37.")
        assert node.status.allocatable["nvidia.com/gpu"] == "1" and not node.spec.unschedulable
    assert env.node(C).metadata.labels["nvidia.com/gpu.deploy.operands"] == "false"  # never replaced
    assert WORKERS[C] not in replace_calls(env)
    assert meaningful(planned_changes(env.project.stack())) == {}


# issue 10 point 4: failed workers --------------------------------------------------------------------------------
def test_failed_worker_stops_up_at_once_and_is_never_taken_for_the_replacement(env):
    """A's new worker ends provision_failed: `up` stops at once with IKS's message and what to do, and B is not
    started. Re-running before fixing names the failed worker again (it is never followed). After the user replaces
    it as told, `up` resumes: it follows the worker IKS created, replacing nothing more itself."""
    env.iks.fail_new_workers = ("provision_failed", "Insufficient capacity for flavor gx3.16x80.l4 in zone us-south-1.")
    env.project.write_stack(env.config(PILOT_STAGES))
    stack = env.project.stack()
    with pytest.raises(CommandError) as failed:
        stack.up(on_output=print)
    message = str(failed.value)
    (failed_worker,) = [w["id"] for w in env.iks.workers.values()
                        if w["lifecycle"]["actualState"] == "provision_failed"]
    assert f"worker {failed_worker} of cluster {env.iks.cluster_name} (the replacement of {WORKERS[A]}) is " \
           f"provision_failed: IKS says: Insufficient capacity" in message
    assert f"ibmcloud ks worker replace --cluster {env.iks.cluster_name} --worker {failed_worker}" in message
    assert "did not" not in message and "within" not in message  # not a timeout
    assert replace_calls(env) == [WORKERS[A]]  # B's batch was never started
    assert f"{B}-gate" not in state_outputs(stack)

    env.iks.fail_new_workers = None  # the cause is fixed; the failed worker stays failed until replaced
    with pytest.raises(CommandError) as again:
        stack.up(on_output=print)
    assert f"worker {failed_worker} of cluster" in str(again.value) and "provision_failed" in str(again.value)
    assert replace_calls(env) == [WORKERS[A]]

    IksClient.from_api(env.iks.api()).replace_worker(env.iks.cluster_name, failed_worker)  # as the message says
    result = stack.up(on_output=print)
    assert result.summary.result == "succeeded"
    assert replace_calls(env) == [WORKERS[A], failed_worker, WORKERS[B]]
    new_a = replaced(result, A)
    assert new_a not in (WORKERS[A], failed_worker)
    assert env.iks.workers[new_a]["lifecycle"]["actualState"] == "deployed"
    assert env.record(new_name(result, A))["result"] == "passed"
    assert meaningful(planned_changes(stack)) == {}


# issue 10 point 11: the new worker and node are recorded; renaming the entries is optional -----------------------
def renamed(stages_config: dict, result, keep_key: bool) -> dict:
    """What following the rename hint does: name -> the new node, workerId -> the new worker (key: the old name)."""
    for node in stages_config["nodes"]:
        if node["stage"] == "ibm-managed":
            continue
        out = result.outputs[f"node:{node['name']}"].value
        if keep_key:
            node["key"] = node["name"]
        node.update(name=out["nodeName"], workerId=out["replacedWorkerId"])
    return stages_config


@pytest.mark.parametrize("keep_key", [True, False])
def test_renaming_the_nodes_or_not_both_converge(env, keep_key):
    first, _ = env.up(PILOT_STAGES)
    stack = env.project.stack()
    assert meaningful(planned_changes(stack)) == {}  # not renaming: nothing to do
    calls = replace_calls(env)
    env.project.write_stack(renamed(env.config(PILOT_STAGES), first, keep_key))
    events = Events()
    result = stack.up(on_output=print, on_event=events)
    assert result.summary.result == "succeeded"
    assert replace_calls(env) == calls  # renaming replaces no worker
    new_a, new_b = new_name(first, A), new_name(first, B)
    if keep_key:  # same resources: only the fences and batch gates (read-only checks of named nodes) run again
        rerun = {n for op, n, kind in events.steps if kind == "pre" and op in (
            "create", "replace", "create-replacement", "delete", "delete-replaced")}
        assert rerun <= {f"{A}-fence", f"{B}-fence", f"{A}-gate", f"{B}-gate"}, rerun
        assert result.outputs[f"node:{A}"].value["nodeName"] == new_a
    else:
        assert result.outputs[f"node:{new_a}"].value["replacedWorkerId"] == replaced(first, A)
    labels = env.node(new_a).metadata.labels
    assert labels[PILOT] == "pilot" and not env.node(new_a).spec.unschedulable
    assert env.node(new_b).status.allocatable["nvidia.com/gpu"] == "1" and not env.node(new_b).spec.unschedulable
    assert meaningful(planned_changes(stack)) == {}
