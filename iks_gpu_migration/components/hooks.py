"""Optional per-node shell commands (config `hooks`), run with pulumi-command's local.Command on the machine running
`pulumi up`: e.g. to move workloads with the team's own tooling before a node is drained or replaced, or to notify
someone once it is verified.

The command gets the node in its environment (VARIABLES below) and nothing else of the operator's: local.Command
runs `<interpreter> <command>` (default `/bin/sh -c`) with the environment of the provider plugin plus `environment`
(pulumi-command v1.2.1 provider/pkg/provider/local/commandOutputs.go `run`: `cmd.Env = os.Environ()`), and the engine
starts plugins with the CLI's whole environment (pulumi sdk/go/common/resource/plugin/plugin.go `execPlugin`), so
without SCRUBBED every hook would see IC_API_KEY, PULUMI_CONFIG_PASSPHRASE, PULUMI_ACCESS_TOKEN, ...
It runs again when any of those values change (a stage change updates the resource, and local.Command runs `create`
again on update when no `update` command is set). Its stdout and stderr go to the `pulumi up` log and are kept in the
state only as secrets (encrypted); a non-zero exit fails the hook resource, named `<node key or name>-<hook>-hook`,
and so stops what depends on it on that node.
"""
from typing import Optional

import pulumi
from pulumi_command import local

from ..config import Node

# The pulumi-command plugin version (what the pulumi_command package requests) whose `run` SCRUBBED was checked
# against; tests/test_sdk_workarounds.py fails when the installed package requests another.
CHECKED_PLUGIN = "1.2.1"
KINDS = {"before-replace": "beforeReplace", "after-verification": "afterVerification"}  # resource part -> config key
VARIABLES = ("GPU_MIGRATION_HOOK", "GPU_MIGRATION_STACK", "GPU_MIGRATION_NODE", "GPU_MIGRATION_CONFIGURED_NODE",
             "GPU_MIGRATION_WORKER_ID", "GPU_MIGRATION_STAGE")
# The interpreter: a shell that replaces itself (`exec env -i`) by `/bin/sh -c <command>` in an empty environment with
# only PATH, HOME and VARIABLES, each read where the hook runs (nothing of them is stored in the state). The command
# is the shell's $1 (local.Command appends it to the interpreter's arguments), never spliced into shell text.
SCRUBBED = ["/bin/sh", "-c",
            "exec /usr/bin/env -i " + " ".join(f'{name}="${name}"' for name in ("PATH", "HOME", *VARIABLES))
            + ' /bin/sh -c "$1"',
            "gpu-migration-hook"]  # $0
SECRET_OUTPUTS = ["stdout", "stderr"]  # what the command printed: kept encrypted in the state


def hook_environment(kind: str, node: Node, hostname: pulumi.Input[str],
                     worker_id: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    env = {
        "GPU_MIGRATION_HOOK": KINDS[kind],
        "GPU_MIGRATION_STACK": pulumi.get_stack(),
        "GPU_MIGRATION_NODE": hostname,  # the node's current name (it can change when the worker is replaced)
        "GPU_MIGRATION_CONFIGURED_NODE": node.name,
        "GPU_MIGRATION_WORKER_ID": worker_id,
        "GPU_MIGRATION_STAGE": node.stage,
    }
    assert tuple(env) == VARIABLES  # SCRUBBED passes exactly these on
    return env


def node_hook(kind: str, command: Optional[str], node: Node, hostname: pulumi.Input[str],
              worker_id: pulumi.Input[str], opts: pulumi.ResourceOptions) -> Optional[local.Command]:
    """The hook resource, or None when the hook is not configured."""
    if not command:
        return None
    return local.Command(
        f"{node.ident}-{kind}-hook",
        create=command,
        interpreter=SCRUBBED,
        environment=hook_environment(kind, node, hostname, worker_id),
        logging=local.Logging.STDOUT_AND_STDERR,
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=SECRET_OUTPUTS)),
    )
