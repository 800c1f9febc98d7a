"""Runs this program under the real Pulumi CLI and engine, with a file backend and passphrase secrets.

The CLI's Python language host (`pulumi-language-python`) is not served by the Go module proxy at any version, so
the program is driven through the Automation API: the CLI runs `pulumi up|preview|refresh --client=<addr>` and the
same program function (`iks_gpu_migration.program.main`) runs in this process. Everything else is the real engine:
the diff, the plan, the state file, the Kubernetes provider plugin and the dynamic-provider host
(`pulumi-resource-pulumi-python`, which imports the installed `iks_gpu_migration` package).
"""
from __future__ import annotations

import json
import pathlib
import urllib.parse
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from pulumi import automation as auto

from . import tools

PROJECT = "gpu-migration"
SDK_ERROR_PREFIXES = ("python inline source runtime error:", "RPC error:")


IBM_CLOUD_KEY = "gpu-migration:ibmCloud"


def is_local_url(url: str) -> bool:
    """http(s) to this machine's loopback: the only endpoints a local environment runs a stack with."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and parts.hostname in ("127.0.0.1", "localhost", "::1")


def session_config(config: Mapping[str, str], iks_endpoint: str) -> dict[str, str]:
    """The config keys to change so the program reaches the session's IKS emulator: its URL in place of the stack
    file's local endpoints (Pulumi.local.yaml says http://127.0.0.1; each session picks a free port). Endpoints that
    are not local stay as they are: a session never points a stack at IBM Cloud, nor away from it. Pure."""
    try:
        ibm = json.loads(config.get(IBM_CLOUD_KEY) or "{}")  # an object reaches the program as JSON
    except ValueError:
        return {}
    if not isinstance(ibm, dict):
        return {}
    local = {k: iks_endpoint for k in ("endpoint", "iamEndpoint")
             if isinstance(ibm.get(k), str) and is_local_url(ibm[k])}
    return {IBM_CLOUD_KEY: json.dumps({**ibm, **local})} if local else {}


def language_server_class(iks_endpoint: Optional[str] = None):
    """The Automation API's LanguageServer, reporting a program's RunError (e.g. an invalid stack config) once, as
    the real language host does: it logs the message and exits with code 32, "already reported" (pulumi
    sdk/python/cmd/pulumi-language-python-exec), which the engine reads as `bail` (sdk/go/common/resource/plugin
    langruntime_plugin.go Run). The SDK's server logs it and also returns it as the program's error, which the CLI
    prints a second time as "an unhandled error occurred" (pulumi/automation/_server.py LanguageServer.Run,
    pulumi 3.272.0). With `iks_endpoint` (a local session's emulator), the program gets it (session_config)."""
    from pulumi.automation._server import LanguageServer

    class ReportedOnce(LanguageServer):
        def Run(self, request, context):  # noqa: N802 - the gRPC method
            if iks_endpoint:
                for key, value in session_config(request.config, iks_endpoint).items():
                    request.config[key] = value
            response = super().Run(request, context)
            if response.error and not response.error.startswith(SDK_ERROR_PREFIXES):
                response.bail = True  # a RunError: logged already
            return response

    ReportedOnce.iks_endpoint = iks_endpoint
    return ReportedOnce


def use_reporting_language_server(iks_endpoint: Optional[str] = None) -> None:
    """Inline programs run through the Automation API get ReportedOnce (it builds its server from this name)."""
    from pulumi.automation import _stack
    if getattr(_stack.LanguageServer, "iks_endpoint", False) != iks_endpoint:  # False: the SDK's own class
        _stack.LanguageServer = language_server_class(iks_endpoint)
PASSPHRASE = "local-passphrase"  # the local stack's secrets protect nothing real


@dataclass
class Engine:
    """One project directory (Pulumi.yaml + Pulumi.<stack>.yaml) and one file backend."""
    project_dir: pathlib.Path
    backend_dir: pathlib.Path
    env: Optional[dict[str, str]] = None
    iks_endpoint: Optional[str] = None  # a local session's IKS emulator, in place of the stack file's (session_config)

    def _workspace_opts(self) -> auto.LocalWorkspaceOptions:
        env = dict(tools.engine_env())
        env.update(self.env or {})
        env.update(PULUMI_CONFIG_PASSPHRASE=PASSPHRASE, PULUMI_BACKEND_URL=self.backend_dir.resolve().as_uri())
        b = tools.bin_dir()
        return auto.LocalWorkspaceOptions(
            work_dir=str(self.project_dir),
            pulumi_home=env["PULUMI_HOME"],
            pulumi_command=auto.PulumiCommand(root=str(b.parent), skip_version_check=True),
            env_vars=env,
        )

    def stack(self, name: str, program: Optional[Callable[[], None]] = None) -> auto.Stack:
        self.backend_dir.mkdir(parents=True, exist_ok=True)
        if program is None:
            from iks_gpu_migration.program import main as program
        use_reporting_language_server(self.iks_endpoint)
        return auto.create_or_select_stack(stack_name=name, project_name=PROJECT, program=program,
                                           opts=self._workspace_opts())

    def cli(self) -> tuple[str, dict[str, str]]:
        """The `pulumi` binary and environment, for commands that need no program (history, export, output)."""
        env = dict(tools.engine_env())
        env.update(self.env or {})
        env.update(PULUMI_CONFIG_PASSPHRASE=PASSPHRASE, PULUMI_BACKEND_URL=self.backend_dir.resolve().as_uri())
        return str(tools.bin_dir() / "pulumi"), env


def printer(prefix: str = "") -> Callable[[str], None]:
    def out(line: str) -> None:
        print(f"{prefix}{line}", flush=True)
    return out


__all__ = ["Engine", "printer"]
