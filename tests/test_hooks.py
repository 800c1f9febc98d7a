"""Per-node hooks (config `hooks`) under Pulumi mocks: pulumi-command local.Command in the right place of each node;
the command run as local.Command runs it, in the scrubbed environment (the real engine: tests/real/test_hooks_engine.py)."""
import copy
import os
import subprocess

from harness import run_program, stack_config
from iks_gpu_migration.components import hooks

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
        assert run.depends(after, f"{node}-switch")
    assert run.depends(f"{DRA_NODE}-after-verification-hook", f"{DRA_NODE}-smoke-verification")
    # Nodes go one at a time (maxUnavailable 1): the second node's hook waits for its batch's gate, which is
    # registered only once the first node is done (rollout.py).
    assert run.depends(f"{DP_NODE}-before-replace-hook", f"{DP_NODE}-gate")
    order = [r.name for r in run.registered]
    assert order.index(f"{DRA_NODE}-switch") < order.index(f"{DP_NODE}-gate")
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
    switch, which ends with the rollback check, readiness, operand placement and the pending GPU pods report."""
    run = run_program(pilot_with_hooks(**{DRA_NODE: "device-plugin"}))
    for node in (DRA_NODE, DP_NODE):
        assert run.depends(f"{node}-switch", f"{node}-before-replace-hook")
        for check in ("switch",):
            assert run.depends(f"{node}-after-verification-hook", f"{node}-{check}"), check
    run = run_program(pilot_with_hooks(**{DP_NODE: "dra"}))
    for node in (DRA_NODE, DP_NODE):
        assert run.depends(f"{node}-switch", f"{node}-before-replace-hook")
        for check in ("switch", "smoke-verification"):
            assert run.depends(f"{node}-after-verification-hook", f"{node}-{check}"), check


def test_only_one_hook_configured():
    raw = pilot_with_hooks()
    del raw["hooks"]["beforeReplace"]
    run = run_program(raw)
    assert {r.name for r in run.of_type(COMMAND)} == {f"{DRA_NODE}-after-verification-hook",
                                                      f"{DP_NODE}-after-verification-hook"}


def test_hook_runs_in_the_scrubbed_shell_and_its_output_is_secret():
    run = run_program(pilot_with_hooks())
    for kind in ("before-replace", "after-verification"):
        hook = run.named(f"{DRA_NODE}-{kind}-hook")
        assert hook.inputs["interpreter"] == hooks.SCRUBBED
        assert hook.inputs["create"] in HOOKS.values()  # the command itself, unchanged
        assert sorted(hook.secret_outputs) == ["stderr", "stdout"]


OPERATOR_SECRETS = {"IC_API_KEY": "ibm-key-123", "PULUMI_CONFIG_PASSPHRASE": "pass-456",
                    "PULUMI_ACCESS_TOKEN": "pul-789", "AWS_SECRET_ACCESS_KEY": "aws-0"}


def run_like_pulumi_command(command: str, environment: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    """What pulumi-command v1.2.1's local.Command does (provider/pkg/provider/local/commandOutputs.go `run`):
    exec.Command(interpreter..., command) with Env = os.Environ() of the provider plugin (the CLI's environment, here
    with the operator's secrets) + `environment`, in the project directory."""
    plugin_env = {**os.environ, **OPERATOR_SECRETS, **environment}
    return subprocess.run([*hooks.SCRUBBED, command], env=plugin_env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)


def hook_env(**overrides) -> dict[str, str]:
    env = {"GPU_MIGRATION_HOOK": "beforeReplace", "GPU_MIGRATION_STACK": "pilot", "GPU_MIGRATION_NODE": DRA_NODE,
           "GPU_MIGRATION_CONFIGURED_NODE": DRA_NODE, "GPU_MIGRATION_WORKER_ID": "kube-pilot0001-gpu-00000101",
           "GPU_MIGRATION_STAGE": "dra"}
    return {**env, **overrides}


def test_the_hook_sees_only_path_home_and_its_variables(tmp_path):
    env = hook_env()
    done = run_like_pulumi_command("env", env, tmp_path)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert not set(OPERATOR_SECRETS) & set(seen)
    assert not any(v in done.stdout for v in OPERATOR_SECRETS.values())
    assert {k: seen.get(k) for k in env} == env
    assert seen["PATH"] == os.environ["PATH"] and seen["HOME"] == os.environ["HOME"]  # read where the hook runs
    # Only what the shell itself sets besides (dash: PWD; bash: also SHLVL and _).
    assert set(seen) - set(env) - {"PATH", "HOME"} <= {"PWD", "OLDPWD", "SHLVL", "_"}, sorted(seen)


def test_the_hook_command_and_values_reach_the_shell_unchanged(tmp_path):
    """The command is the shell's $1 and the values are expanded once inside double quotes: quotes, `$`, `;` and
    command substitutions in either are never evaluated by the wrapper."""
    (tmp_path / "marker").unlink(missing_ok=True)
    odd = 'st"ack $(touch marker) `touch marker` $HOME; x'
    command = "printf '%s|' \"a b\" '$HOME' \"$GPU_MIGRATION_STACK\"; echo \"$0\"; exit 3"
    done = run_like_pulumi_command(command, hook_env(GPU_MIGRATION_STACK=odd), tmp_path)
    assert done.returncode == 3  # a failing hook still fails its resource
    assert done.stdout == f"a b|$HOME|{odd}|/bin/sh\n"
    assert not (tmp_path / "marker").exists()
