"""Per-node hooks (config `hooks`) under Pulumi mocks: pulumi-command local.Command in the right place of each node."""
import copy

from harness import run_program, stack_config

DRA_NODE, DP_NODE, IBM_NODE = "10.240.0.11", "10.240.0.12", "10.240.0.13"
COMMAND = "command:local:Command"
HOOKS = {"beforeReplace": "./move-workloads.sh", "afterVerification": "./notify.sh"}


def pilot_with_hooks(**stages):
    raw = copy.deepcopy(stack_config("pilot"))
    raw["hooks"] = dict(HOOKS)
    for node in raw["nodes"]:
        node["stage"] = stages.get(node["name"], node["stage"])
    return raw


def test_no_hooks_without_config():
    run = run_program(stack_config("pilot"))
    assert not run.of_type(COMMAND)


def test_hooks_run_before_replacement_and_after_verification():
    run = run_program(pilot_with_hooks())
    hooks = {r.name for r in run.of_type(COMMAND)}
    assert hooks == {f"{n}-{k}-hook" for n in (DRA_NODE, DP_NODE) for k in ("before-replace", "after-verification")}
    for node in (DRA_NODE, DP_NODE):
        before, after = f"{node}-before-replace-hook", f"{node}-after-verification-hook"
        assert run.named(before).inputs["create"] == "./move-workloads.sh"
        assert run.named(after).inputs["create"] == "./notify.sh"
        assert run.named(before).inputs["logging"] == "stdoutAndStderr"
        # Before: after the master and the node's fence, before its replacement (and so its drain and labels).
        assert run.depends(f"{node}-replacement", before) and run.depends(before, "master-version")
        assert run.depends(before, f"{node}-fence")
        assert not run.depends(before, f"{node}-replacement")
        # After: once the node is verified.
        assert run.depends(after, f"{node}-operator-ready")
    assert run.depends(f"{DRA_NODE}-after-verification-hook", f"{DRA_NODE}-smoke-verification")
    # Nodes go one at a time (maxUnavailable 1): the second node's hook waits for its batch's gate, which is
    # registered only once the first node is done (rollout.py).
    assert run.depends(f"{DP_NODE}-before-replace-hook", "batch-2-gate")
    order = [r.name for r in run.registered]
    assert order.index(f"{DRA_NODE}-pending-gpu-pods") < order.index("batch-2-gate")
    assert not {f"{IBM_NODE}-before-replace-hook", f"{IBM_NODE}-after-verification-hook"} & run.names()


def test_hook_environment_names_node_worker_and_stage():
    run = run_program(pilot_with_hooks())
    env = run.named(f"{DRA_NODE}-before-replace-hook").inputs["environment"]
    assert env == {"GPU_MIGRATION_HOOK": "beforeReplace", "GPU_MIGRATION_STACK": "test",
                   "GPU_MIGRATION_NODE": DRA_NODE, "GPU_MIGRATION_CONFIGURED_NODE": DRA_NODE,
                   "GPU_MIGRATION_WORKER_ID": "kube-pilot0001-gpu-00000101", "GPU_MIGRATION_STAGE": "dra"}
    env = run.named(f"{DRA_NODE}-after-verification-hook").inputs["environment"]
    assert env["GPU_MIGRATION_HOOK"] == "afterVerification"
    assert env["GPU_MIGRATION_WORKER_ID"] == "kube-pilot0001-gpu-00000101-new"  # the replaced worker


def test_before_hook_precedes_the_path_switch_and_after_hook_follows_every_check():
    """The switch drains the node (both ways): the team's own workload move runs first; the after hook waits for the
    switch, the rollback check, the operand placement and the pending GPU pods report."""
    run = run_program(pilot_with_hooks(**{DRA_NODE: "device-plugin"}))
    for node in (DRA_NODE, DP_NODE):
        assert run.depends(f"{node}-switch", f"{node}-before-replace-hook")
        for check in ("switch", "rollback", "operator-ready", "operand-placement", "pending-gpu-pods"):
            assert run.depends(f"{node}-after-verification-hook", f"{node}-{check}"), check
    run = run_program(pilot_with_hooks(**{DP_NODE: "dra"}))
    for node in (DRA_NODE, DP_NODE):
        assert run.depends(f"{node}-switch", f"{node}-before-replace-hook")
        for check in ("switch", "smoke-verification", "pending-gpu-pods"):
            assert run.depends(f"{node}-after-verification-hook", f"{node}-{check}"), check


def test_only_one_hook_configured():
    raw = pilot_with_hooks()
    del raw["hooks"]["beforeReplace"]
    run = run_program(raw)
    assert {r.name for r in run.of_type(COMMAND)} == {f"{DRA_NODE}-after-verification-hook",
                                                      f"{DP_NODE}-after-verification-hook"}
