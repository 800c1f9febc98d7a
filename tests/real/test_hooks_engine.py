"""A hook under the real CLI and engine (the pulumi-command plugin played by tests/real/command_plugin.py): it runs
without the operator's secrets in its environment, and what it printed is stored in the state only encrypted."""
import json
import subprocess

import pulumi

from iks_gpu_migration.components import hooks
from iks_gpu_migration.config import Node

from . import command_plugin

SECRETS = {"IC_API_KEY": "ibm-key-0123456789", "PULUMI_ACCESS_TOKEN": "pul-0123456789"}
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # pulumi's secret marker in checkpoints


def test_hook_sees_no_operator_secret_and_its_output_is_encrypted_in_the_state(project, tmp_path):
    pulumi_cli, cli_env = project.engine.cli()
    home = tmp_path / "pulumi-home"  # this test's own plugin set: the stand-in is never seen by other tests
    command_plugin.install(pulumi_cli, home, command_plugin.plugin_version(), cli_env)
    project.engine.env = {**(project.engine.env or {}), **SECRETS, "PULUMI_HOME": str(home)}
    node = Node(name="10.9.7.1", worker_id="kube-hooks-0001", stage="dra")

    def program():
        hooks.node_hook("before-replace", 'env; echo "hook for $GPU_MIGRATION_NODE" >&2', node, node.name,
                        node.worker_id, opts=pulumi.ResourceOptions())

    project.write_stack({}, stack="hooks")
    stack = project.stack("hooks", program)
    assert stack.up(on_output=print).summary.result == "succeeded"

    pulumi_cli, cli_env = project.engine.cli()
    assert cli_env["PULUMI_CONFIG_PASSPHRASE"] and cli_env["IC_API_KEY"]  # in the CLI's, so in the plugin's env
    export = subprocess.run([pulumi_cli, "stack", "export", "--stack", "hooks"], cwd=project.dir, env=cli_env,
                            capture_output=True, text=True, check=True).stdout
    hook = next(r for r in json.loads(export)["deployment"]["resources"] if r["type"] == command_plugin.PLUGIN_TYPE)
    for name in hooks.SECRET_OUTPUTS:
        assert hook["outputs"][name].get(SECRET_SIG) and "ciphertext" in hook["outputs"][name], hook["outputs"][name]
    assert "GPU_MIGRATION_NODE=10.9.7.1" not in export and "hook for 10.9.7.1" not in export  # only as ciphertext

    shown = subprocess.run([pulumi_cli, "stack", "export", "--stack", "hooks", "--show-secrets"], cwd=project.dir,
                           env=cli_env, capture_output=True, text=True, check=True).stdout
    outputs = next(r for r in json.loads(shown)["deployment"]["resources"]
                   if r["type"] == command_plugin.PLUGIN_TYPE)["outputs"]
    seen = dict(line.split("=", 1) for line in outputs["stdout"]["plaintext"].strip('"').split("\\n"))
    assert outputs["stderr"]["plaintext"] == json.dumps("hook for 10.9.7.1")
    assert seen["GPU_MIGRATION_NODE"] == "10.9.7.1" and seen["GPU_MIGRATION_WORKER_ID"] == "kube-hooks-0001"
    assert seen["GPU_MIGRATION_STACK"] == "hooks" and "PATH" in seen and "HOME" in seen
    assert seen["PWD"] == str(project.dir)  # the plugin runs in the project directory (docs/operations.md)
    leaked = {k for k in ("IC_API_KEY", "PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_HOME") if k in seen}
    assert not leaked, f"the hook saw {leaked}"
    assert not any(v in outputs["stdout"]["plaintext"] for v in (*SECRETS.values(), cli_env["PULUMI_CONFIG_PASSPHRASE"]))
    stack.destroy(on_output=print)
