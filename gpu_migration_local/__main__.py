"""The local demo: builds or finds the tools, starts the control plane, the IKS emulator and the GPU doubles, and runs
the whole migration with the real `pulumi up` on the `local` stack (Pulumi.local.yaml). The environment then stays up
until Ctrl-C (or `stop`), as a rehearsal session: `env`, `pulumi`, `status` and kubectl work against it. Every run
starts afresh: the IKS emulator lives in this process, so an earlier run's cluster and stack state could not match it.
Every port is a free one on 127.0.0.1, so environments of other clones run side by side; one per clone.

    venv/bin/python -m gpu_migration_local [--project DIR] [up|preview] [--stack local] [--exit]

A local environment that stays up between commands, to rehearse the commands you will run against IKS
(gpu_migration_local/session.py, pulumi_cli.py):

    venv/bin/python -m gpu_migration_local [--project DIR] start [--stack local]   # until `stop` or Ctrl-C
    venv/bin/python -m gpu_migration_local [--project DIR] env                     # `export` lines for a shell
    venv/bin/python -m gpu_migration_local [--project DIR] pulumi <pulumi arguments>
    venv/bin/python -m gpu_migration_local [--project DIR] stop
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from . import pulumi_cli, session
from .engine import Engine, printer

REPO = pathlib.Path(__file__).resolve().parents[1]
STATE = REPO / ".local"  # git-ignored: cluster data, kubeconfig, file backend
SESSION_COMMANDS = ("start", "stop", "env", "pulumi")
COMMANDS = """commands:
  up, preview      the demo (default: up): start the environment, run `pulumi up` (or preview) of the stack with
                   progress, then stay up as a session until Ctrl-C (--exit: stop when the run ends)
  start            start the environment and keep it up until `stop` or Ctrl-C [--stack local]
  env              `export` lines for a shell: after eval "$(python -m gpu_migration_local env)", plain `pulumi`,
                   `status` and kubectl reach the running session
  pulumi ARGS      the real Pulumi CLI against the running session, every argument passed through
  stop             stop the running session (when none runs: says so, exit code 0)

docs/operations.md#rehearse-locally walks through them."""


def session_command(argv: list[str]) -> int | None:
    """start / stop / env / pulumi (the rehearsal's session); None if `argv` is the demo's."""
    project = REPO
    if argv[:1] == ["--project"] and len(argv) > 1:
        project, argv = pathlib.Path(argv[1]).resolve(), argv[2:]
    if not argv or argv[0] not in SESSION_COMMANDS:
        return None
    paths = session.Paths(project)
    try:
        if argv[0] == "pulumi":
            return pulumi_cli.main(argv[1:], paths)
        if argv[0] == "env":
            print(session.shell_exports(session.require_session(paths)))
            return 0
        if argv[0] == "stop":
            return session.stop(paths)
        parser = argparse.ArgumentParser(prog="python -m gpu_migration_local start")
        parser.add_argument("--stack", default="local")
        args = parser.parse_args(argv[1:])
        return session.Session(paths, args.stack, say=lambda line: print(line, flush=True)).run()
    except session.SessionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def summary(outputs: dict) -> str:
    """What the run proved, per node, from the stack outputs (iks_gpu_migration.components.migration.export)."""
    lines = ["", "What this run proved:"]
    for key, output in sorted(outputs.items()):
        if not key.startswith("node:"):
            continue
        node = output.value
        line = f"  {node['configName']}: stage {node['stage']}"
        if node.get("replacedWorkerId"):
            line += f", worker replaced by {node['replacedWorkerId']} (node {node['nodeName']})"
        if node["stage"] == "ibm-managed":
            line += ", kept on IBM's drivers and fenced off the GPU Operator"
        elif node["stage"] == "device-plugin":
            line += ", the GPU Operator's driver and device plugin ready, its GPU offered as nvidia.com/gpu"
        if node.get("smokeTest"):
            line += f"; smoke test {node['smokeTest']}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    code = session_command(argv)
    if code is not None:
        return code
    parser = argparse.ArgumentParser(prog="python -m gpu_migration_local", description=__doc__, epilog=COMMANDS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="up", choices=["up", "preview", *SESSION_COMMANDS],
                        metavar="command", help="up (default), preview, start, stop, env or pulumi: see below")
    parser.add_argument("--project", type=pathlib.Path, default=REPO, metavar="DIR",
                        help="the project directory (Pulumi.yaml, Pulumi.<stack>.yaml; its .local/); default: this "
                             "repository")
    parser.add_argument("--stack", default="local", help="runs Pulumi.<stack>.yaml (default: local)")
    parser.add_argument("--exit", action="store_true", help="stop the cluster when the run ends (no inspection)")
    args = parser.parse_args(argv)
    if args.command in SESSION_COMMANDS:  # only reached when options came first
        parser.error(f"put {args.command} first, after --project DIR only: "
                     f"python -m gpu_migration_local [--project DIR] {args.command} ...")
    paths = session.Paths(args.project.resolve())

    def run_stack(engine: Engine) -> int:
        stack = engine.stack(args.stack)
        print(f"running pulumi {args.command} --stack {args.stack} ...", flush=True)
        try:
            if args.command == "preview":
                stack.preview(on_output=printer())
            else:
                print(summary(stack.up(on_output=printer()).outputs), flush=True)
        except Exception:  # noqa: BLE001 - the CLI printed its errors as they came; its whole output again adds nothing
            print(f"\npulumi {args.command} --stack {args.stack} failed: its errors are above", file=sys.stderr)
            return 1
        return 0

    try:
        return session.Session(paths, args.stack, say=lambda line: print(line, flush=True)).run(
            first=run_stack, stay=not args.exit)
    except session.SessionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
