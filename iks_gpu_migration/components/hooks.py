"""Optional per-node shell commands (config `hooks`), run with pulumi-command's local.Command on the machine running
`pulumi up`: e.g. to move workloads with the team's own tooling before a node is drained or replaced, or to notify
someone once it is verified.

The command gets the node in its environment (ENV below). It runs again when any of those values change (a stage
change updates the resource, and local.Command runs `create` again on update when no `update` command is set).
Its stdout and stderr go to the `pulumi up` log; a non-zero exit fails the hook resource, named
`<node key or name>-<hook>-hook`, and so stops what depends on it on that node.
"""
from typing import Optional

import pulumi
from pulumi_command import local

from ..config import Node

KINDS = {"before-replace": "beforeReplace", "after-verification": "afterVerification"}  # resource part -> config key


def hook_environment(kind: str, node: Node, hostname: pulumi.Input[str],
                     worker_id: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    return {
        "GPU_MIGRATION_HOOK": KINDS[kind],
        "GPU_MIGRATION_STACK": pulumi.get_stack(),
        "GPU_MIGRATION_NODE": hostname,  # the node's current name (it can change when the worker is replaced)
        "GPU_MIGRATION_CONFIGURED_NODE": node.name,
        "GPU_MIGRATION_WORKER_ID": worker_id,
        "GPU_MIGRATION_STAGE": node.stage,
    }


def node_hook(kind: str, command: Optional[str], node: Node, hostname: pulumi.Input[str],
              worker_id: pulumi.Input[str], opts: pulumi.ResourceOptions) -> Optional[local.Command]:
    """The hook resource, or None when the hook is not configured."""
    if not command:
        return None
    return local.Command(
        f"{node.ident}-{kind}-hook",
        create=command,
        environment=hook_environment(kind, node, hostname, worker_id),
        logging=local.Logging.STDOUT_AND_STDERR,
        add_previous_output_in_env=False,
        opts=opts,
    )
