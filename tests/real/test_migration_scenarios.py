"""Whole-migration scenarios under the real Pulumi CLI and engine, against the local control plane (real scheduler,
real DRA allocation, real controllers) and the IKS emulator. Each test gets its own cluster."""
import contextlib
import os
import signal
import time

import pytest
from kubernetes import client
from pulumi.automation import CommandError, ConfigValue

from gpu_migration_local.gpu_doubles import gpu_uuid
from preview_diff import preview

from .project import by_symbol, meaningful, planned_changes
from .scenario_env import A, B, C, PILOT, PILOT_STAGES, PLUGIN, interrupted_up, new_name


# 1 -----------------------------------------------------------------------------------------------------------------
def test_fresh_up_to_one_dra_node(env):
    result, events = env.up(PILOT_STAGES)
    # The master reached 1.37 before any worker was replaced, one minor at a time.
    calls = [(m, p) for m, p in env.iks.requests if p.startswith("/v1/clusters/") or p == "/v2/vpc/replaceWorker"]
    assert [m for m, _ in calls[:2]] == ["PUT", "PUT"], calls
    assert {p for _, p in calls[2:]} == {"/v2/vpc/replaceWorker"} and len(calls) == 4, calls
    # The fences came before the operator; replacements ran one at a time (B's after A's readiness).
    assert events.index(f"{A}-fence", "done") < events.index("gpu-operator", "pre")
    assert events.index(f"{B}-fence", "done") < events.index("gpu-operator", "pre")
    assert events.index(f"{A}-switch", "done") < events.index(f"{B}-replacement", "pre")  # with its readiness

    new_a, new_b = new_name(result, A), new_name(result, B)
    assert new_a not in (A, B, C)
    labels = env.node(new_a).metadata.labels
    assert labels[PILOT] == "pilot" and labels[PLUGIN] == "false"
    # The smoke pod was scheduled by the real scheduler through DRA onto the pilot node and passed all 4 criteria.
    smoke = result.outputs[f"node:{A}"].value["smokeTest"]
    assert smoke.startswith("passed") and gpu_uuid(new_a, 0) in smoke, smoke
    record = env.record(new_a)
    assert record["result"] == "passed" and record["gpu"] == gpu_uuid(new_a, 0), record
    assert not env.node(new_a).spec.unschedulable
    # Never one GPU on two paths: the dra node offers no plugin GPUs; B has the operator's; C keeps IBM's.
    assert (env.node(new_a).status.allocatable or {}).get("nvidia.com/gpu", "0") == "0"
    assert env.node(new_b).status.allocatable["nvidia.com/gpu"] == "1"
    assert env.node(C).metadata.labels["nvidia.com/gpu.deploy.operands"] == "false"
    assert meaningful(planned_changes(env.project.stack())) == {}


# 2 -----------------------------------------------------------------------------------------------------------------
def test_preview_of_one_more_dra_node_shows_what_the_readme_says(env):
    env.up(PILOT_STAGES)
    old = env.config(PILOT_STAGES)
    new = env.config({**PILOT_STAGES, B: "dra"})
    env.project.write_stack(new)
    real = by_symbol(meaningful(planned_changes(env.project.stack())))
    promised = {k: v for k, v in preview(old, new).items() if k != "every up" and v}
    assert real == promised


# 3 -----------------------------------------------------------------------------------------------------------------
def test_pilot_expansion_by_editing_the_stack_file(env):
    first, _ = env.up(PILOT_STAGES)
    replaces_before = env.iks.count("POST", "/v2/vpc/replaceWorker")
    result, _ = env.up({**PILOT_STAGES, B: "dra"})
    new_a, new_b = new_name(result, A), new_name(result, B)
    assert new_b == new_name(first, B)  # moving to dra replaces no worker
    assert env.iks.count("POST", "/v2/vpc/replaceWorker") == replaces_before
    for n in (new_a, new_b):
        labels = env.node(n).metadata.labels
        assert labels[PILOT] == "pilot" and labels[PLUGIN] == "false"
        assert env.record(n)["result"] == "passed"
        assert not env.node(n).spec.unschedulable
    assert env.record(new_b)["gpu"] == gpu_uuid(new_b, 0)


# 4 -----------------------------------------------------------------------------------------------------------------
def test_rollback_through_stack_history(env):
    env.up(PILOT_STAGES)
    good = (env.project.dir / "Pulumi.local.yaml").read_text()  # the stack file of the update that was good
    expanded, _ = env.up({**PILOT_STAGES, B: "dra"})
    new_b = new_name(expanded, B)
    # "git checkout <commit> -- Pulumi.local.yaml": the earlier stack file comes back.
    (env.project.dir / "Pulumi.local.yaml").write_text(good)
    stack = env.project.stack()
    result = stack.up(on_output=print)
    assert result.summary.result == "succeeded"
    labels = env.node(new_b).metadata.labels
    assert PILOT not in labels and labels[PLUGIN] == "true"
    assert env.node(new_b).status.allocatable["nvidia.com/gpu"] == "1"
    assert not env.node(new_b).spec.unschedulable
    record = env.record(new_b)
    assert record["result"] == "passed" and record["path"] == "device-plugin", record
    # The DeviceClass stays while A is dra, and A still passes.
    classes = client.CustomObjectsApi(env.cluster.api_client).list_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses")["items"]
    assert any(c["spec"].get("extendedResourceName") == "nvidia.com/gpu" for c in classes)
    assert env.node(new_name(result, A)).metadata.labels[PILOT] == "pilot"
    # Three updates in the stack history.
    assert len(stack.history()) == 3


# 6 -----------------------------------------------------------------------------------------------------------------
def test_failing_smoke_test_stops_up_and_names_the_criterion(env):
    env.cluster.doubles.smi_fault = "uuid=GPU-00000000-0000-0000-0000-000000000000"
    env.project.write_stack(env.config(PILOT_STAGES))
    stack = env.project.stack()
    with pytest.raises(CommandError) as failed:
        stack.up(on_output=print)
    assert "criterion 3" in str(failed.value) and "GPU-00000000" in str(failed.value)
    assert "Fix the cause and run `pulumi up` again" in str(failed.value)
    # It names the pod, the node and both GPUs, and no other criterion; the failure is recorded on the node, which
    # stays cordoned, and not in the stack state (the next `up` judges again).
    deployed = {r["urn"].rsplit("::", 1)[1]: r for r in stack.export_stack().deployment["resources"]}
    new_a = deployed[f"{A}-replacement"]["outputs"]["node_name"]
    assert f"smoke test gpu-pilot/gpu-smoke-test-{A} on node {new_a} failed" in str(failed.value)
    assert "criterion 3 (GPU in logs)" in str(failed.value) and gpu_uuid(new_a, 0) in str(failed.value)
    assert not any(f"criterion {n}" in str(failed.value) for n in (1, 2, 4))
    assert f"{A}-smoke-verification" not in deployed
    record = env.record(new_a)
    assert record["result"] == "failed" and "criterion 3" in record["problems"][0], record
    assert env.node(new_a).spec.unschedulable
    # The fault is fixed; the documented command (`pulumi up` again) replaces the pod and passes.
    env.cluster.doubles.smi_fault = ""
    result = stack.up(on_output=print)
    new_a = new_name(result, A)
    assert env.record(new_a)["result"] == "passed"
    assert not env.node(new_a).spec.unschedulable


# 7 -----------------------------------------------------------------------------------------------------------------
def test_bad_config_fails_preview_naming_the_key_and_creates_nothing(env):
    cfg = env.config(PILOT_STAGES)
    cfg["nodes"][1]["stage"] = "dra-pilot"
    cfg["ibmApiKey"] = env.iks.api_key  # `pulumi config set` without --secret: readable in the stack file
    env.project.write_stack(cfg)
    stack = env.project.stack()
    output: list[str] = []
    with pytest.raises(CommandError) as failed:
        stack.preview(on_output=lambda line: (output.append(line), print(line)))
    assert "gpu-migration:nodes[1].stage" in str(failed.value) and "dra-pilot" in str(failed.value)
    # Said once (issue 19): the problems once under Diagnostics, no Python traceback, no "unhandled error" repeat.
    text = "\n".join(output)
    assert text.count("gpu-migration:nodes[1].stage") == 1 and "Traceback" not in text, text
    assert "an unhandled error occurred" not in text, text
    # Told apart by the engine (the program's configSecretKeys), reported with the other problem.
    assert "gpu-migration:ibmApiKey: is set in plain text" in str(failed.value)
    assert "pulumi config set --secret gpu-migration:ibmApiKey" in str(failed.value)
    with pytest.raises(CommandError):
        stack.up(on_output=print)
    assert [r for r in stack.export_stack().deployment.get("resources", [])
            if r["type"] != "pulumi:pulumi:Stack"] == []
    assert all(not (n.metadata.labels or {}).get("nvidia.com/gpu.deploy.operands") for n in env.core.list_node().items)
    assert env.iks.count("PUT", f"/v1/clusters/{env.iks.cluster_name}") == 0
    # Fixed: the stage, and the key set as a secret (encrypted in the stack file): preview passes.
    del cfg["ibmApiKey"]
    cfg["nodes"][1]["stage"] = PILOT_STAGES[B]
    env.project.write_stack(cfg)
    stack.set_config("gpu-migration:ibmApiKey", ConfigValue(env.iks.api_key, secret=True))
    assert env.iks.api_key not in (env.project.dir / "Pulumi.local.yaml").read_text()
    stack.preview(on_output=print)


# 5 -----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_interrupted_up_during_a_replacement_converges_with_one_replacement_per_node(env, signal_name):
    env.project.write_stack(env.config(PILOT_STAGES))
    stack = env.project.stack()
    env.iks.stick_new_workers = True  # the first replacement stays provisioning until we let it go
    plugins: list[int] = []
    interrupted_up(stack, lambda: env.iks.count("POST", "/v2/vpc/replaceWorker") == 1, "the first replaceWorker",
                   signal_name, timeout=120, plugins=plugins)
    if signal_name == "SIGKILL":
        # The killed CLI's provider host lives on, orphaned; its waits notice the engine is gone and stop, so it
        # does nothing (here: no more polling of the stuck worker) while the next `up` resumes the replacement.
        time.sleep(2)
        calls = len(env.iks.requests)
        time.sleep(3)
        assert env.iks.requests[calls:] == [], "the killed CLI's provider host still works"
        assert plugins, "the killed CLI had no plugin processes"
        for pid in plugins:  # README: end the leftovers before `recover`
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    env.iks.stuck.clear()
    env.iks.stick_new_workers = False

    # The documented recovery (README, "Interrupted runs"): after SIGINT the engine records the interruption and
    # releases the stack; `pulumi up` again resumes the replacement from the worker's real state. After SIGKILL,
    # `python -m iks_gpu_migration.recover` resolves the pending creates first.
    if signal_name == "SIGKILL":
        from iks_gpu_migration.cli.recover import recover
        pulumi, cli_env = env.project.engine.cli()
        assert recover("local", pulumi, cli_env, out=print, kubeconfig=str(env.cluster.kubeconfig),
                       cwd=str(env.project.dir), yes=True) == 0
    result = stack.up(on_output=print)
    assert result.summary.result == "succeeded"
    # Exactly one replacement per migrated node.
    assert env.iks.count("POST", "/v2/vpc/replaceWorker") == 2, env.iks.requests
    assert env.record(new_name(result, A))["result"] == "passed"
    assert meaningful(planned_changes(stack)) == {}


# 8 -----------------------------------------------------------------------------------------------------------------
def test_refresh_reflects_reality_and_the_next_up_repairs_it(env):
    result, _ = env.up(PILOT_STAGES)
    new_a, new_b = new_name(result, A), new_name(result, B)
    stack = env.project.stack()
    # Someone removes the pilot label from the dra node.
    env.core.patch_node(new_a, {"metadata": {"labels": {PILOT: None}}})
    b_worker = result.outputs[f"node:{B}"].value["replacedWorkerId"]

    stack.refresh(on_output=print)
    resources = {r["urn"].rsplit("::", 1)[1]: r for r in stack.export_stack().deployment["resources"]}
    assert resources[f"{A}-switch"]["outputs"]["observed_path"] == "mixed"
    assert resources[f"{B}-replacement"]["outputs"]["worker_state"] == "deployed"  # read back from IKS
    replaces = env.iks.count("POST", "/v2/vpc/replaceWorker")

    after = stack.up(on_output=print)
    assert after.summary.result == "succeeded"
    assert env.node(new_a).metadata.labels[PILOT] == "pilot"  # repaired by the switch
    assert env.iks.count("POST", "/v2/vpc/replaceWorker") == replaces  # nothing replaced again
    b_now = after.outputs[f"node:{B}"].value
    assert b_now["replacedWorkerId"] == b_worker and b_now["nodeName"] == new_b
    assert meaningful(planned_changes(stack)) == {}
