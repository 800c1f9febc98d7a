"""`python -m gpu_migration_local pulumi <args>`: the real Pulumi CLI against the running local session, every argument
passed through, so a rehearsal types the commands it will type against IKS.

The CLI runs a Python program through its language host, `pulumi-language-python`, which no Go module served here
builds (gpu_migration_local/engine.py). For the commands that run the program (`up`, `preview`, `refresh`, `destroy`,
`import`), this serves the program itself over the CLI's language-runtime protocol on 127.0.0.1, as the Automation API
does for inline programs (pulumi/automation/_stack.py: a LanguageServer and `--client=127.0.0.1:<port>`), and runs
the CLI with that flag; the CLI, engine, providers and backend are the real ones. Every other command (`stack
history`, `stack output`, `config`, `stack export`, `cancel`, ...) needs no program and runs as is. The CLI inherits
this terminal (its prompts, colors and Ctrl-C), and its exit code is this command's. After the `eval` of `env`, plain
`pulumi` is this command (.local/bin/pulumi: session.write_pulumi_wrapper).
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent import futures
from typing import Optional

from . import tools
from .session import Paths, require_session, session_env

PROGRAM_COMMANDS = {"up", "update", "preview", "pre", "refresh", "destroy", "down", "import"}
# Commands that walk the plan's nodes (their preview warns when --parallel holds nodes in flight back): given this
# --parallel unless the user gives one. Above any local fleet's slots + 8 (components/rollout.py parallel_needed);
# the engine only runs that many steps at once, it never lets more nodes out (the slots and gates decide that).
LOCAL_PARALLEL = 64
PARALLEL_COMMANDS = {"up", "update", "preview", "pre"}


def _serve_program(iks_endpoint: Optional[str]):
    """The program over the language-runtime protocol on 127.0.0.1 (an ephemeral port), reaching the session's IKS
    emulator at `iks_endpoint` (engine.session_config); returns (server, port)."""
    import grpc
    from pulumi.runtime.proto import language_pb2_grpc

    from iks_gpu_migration.program import main as program

    from .engine import language_server_class
    LanguageServer = language_server_class(iks_endpoint)  # noqa: N806 - a class

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 2**31 - 1)])
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(LanguageServer(program), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def command_for(args: list[str], port: Optional[int]) -> list[str]:
    """The CLI's arguments: the user's, then (for a program command) where the program is served, and for `up` and
    `preview` without one a --parallel that moves every node in flight at once. Pure."""
    extra = [f"--client=127.0.0.1:{port}", "--exec-kind", "auto.inline"] if port is not None else []
    given = any(a in ("-p", "--parallel") or a.startswith("--parallel=") for a in args)
    if port is not None and command_of(args) in PARALLEL_COMMANDS and not given:
        extra += ["--parallel", str(LOCAL_PARALLEL)]
    return [str(tools.bin_dir() / "pulumi"), *args, *extra]


# Global flags of the CLI that take their value as the next argument (pulumi/pulumi pkg/cmd/pulumi/pulumi.go).
VALUE_FLAGS = {"-C", "--cwd", "--color", "-v", "--verbose", "--profiling", "--tracing", "--tracing-header",
               "--memprofilerate"}


def command_of(args: list[str]) -> str:
    """The CLI command: its first word after global flags ("" without one). Pure."""
    rest = iter(args)
    for arg in rest:
        if arg in VALUE_FLAGS:
            next(rest, None)
        elif not arg.startswith("-"):
            return arg
    return ""


def runs_program(args: list[str]) -> bool:
    """Whether the CLI command runs the program. Pure."""
    return command_of(args) in PROGRAM_COMMANDS


def killed_message(returncode: int, args: list[str]) -> str:
    """What to say when the CLI ended by a signal (a wrapper's exit code 128 + n said nothing before): an `up` cut
    short leaves the stack locked and its operations pending, and `recover` is next (docs/recovery.md). Pure."""
    import signal
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    what = command_of(args) or "pulumi"
    advice = ("; run `venv/bin/python -m iks_gpu_migration.cli.recover --stack <stack>` next (docs/recovery.md): it "
              "clears the lock and what the cut-short update left pending" if runs_program(args) else "")
    return f"the Pulumi CLI running `{what}` was ended by {name}{advice}"


def main(args: list[str], paths: Paths) -> int:
    record = require_session(paths)
    env = session_env(record)
    server = port = None
    if runs_program(args):
        os.chdir(paths.project)  # the program reads paths of the stack file relative to the project, as the CLI runs it
        server, port = _serve_program(record.get("iksEndpoint"))
    try:
        code = subprocess.run(command_for(args, port), cwd=paths.project, env=env).returncode
        if code < 0:  # ended by a signal (SIGKILL: the wrapper's shell showed 247 and nothing else)
            print(killed_message(code, args), file=sys.stderr)
            return 128 - code
        return code
    except KeyboardInterrupt:
        return 130  # the CLI got the same Ctrl-C and reported it
    finally:
        if server is not None:
            server.stop(0)
