"""The stack recover works on: this project's directory, the `pulumi` CLI run there, and checks that the state it
exports is this project's and this stack's."""
from __future__ import annotations

import json
import pathlib
import subprocess
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from ...config.model import NAMESPACE as PROJECT  # the program's config namespace is its Pulumi project name


class RecoverError(Exception):
    """recover stops; the message says why and what to do. Nothing was changed unless it says so."""


def project_dir(path: pathlib.Path) -> pathlib.Path:
    """`path`, if it holds this program's Pulumi.yaml (project `gpu-migration`); the CLI resolves `--stack` against
    the Pulumi.yaml of its working directory, so elsewhere it would pick another project's stack of that name."""
    path = path.resolve()
    found = [p for p in (path / "Pulumi.yaml", path / "Pulumi.yml") if p.is_file()]
    hint = f"run recover in the project directory (its Pulumi.yaml says `name: {PROJECT}`) or pass --project-dir"
    if not found:
        raise RecoverError(f"{path} has no Pulumi.yaml: {hint}")
    try:
        name = (yaml.safe_load(found[0].read_text()) or {}).get("name")
    except (yaml.YAMLError, AttributeError) as e:
        raise RecoverError(f"{found[0]} is not readable YAML ({' '.join(str(e).split())}): {hint}") from None
    if name != PROJECT:
        raise RecoverError(f"{found[0]} is project {name!r}, not {PROJECT!r}: {hint}")
    return path


def stack_name(stack: str) -> str:
    """The stack's own name from `--stack` (`name`, `org/name` or `org/project/name`); the project, if given, must
    be this one."""
    parts = stack.split("/")
    if len(parts) > 3 or not all(parts):
        raise RecoverError(f"--stack {stack!r} is not a stack name (`name`, `org/name` or `org/{PROJECT}/name`)")
    if len(parts) == 3 and parts[1] != PROJECT:
        raise RecoverError(f"--stack {stack!r} names project {parts[1]!r}; recover works on {PROJECT!r} stacks only")
    return parts[-1]


def foreign_urns(deployment: dict[str, Any], stack: str) -> list[str]:
    """URNs in the state that are not `urn:pulumi:<stack>::gpu-migration::...` (resources, pending operations, and
    the parents, providers and dependencies they name)."""
    prefix = f"urn:pulumi:{stack}::{PROJECT}::"
    found: set[str] = set()
    resources = list(deployment.get("resources") or [])
    resources += [op.get("resource") or {} for op in deployment.get("pending_operations") or []]
    for r in resources:
        urns = [r.get("urn"), r.get("parent"), r.get("deletedWith"), *(r.get("dependencies") or [])]
        urns += [u for deps in (r.get("propertyDependencies") or {}).values() for u in deps or []]
        if r.get("provider"):
            urns.append(r["provider"].rsplit("::", 1)[0])  # `<provider urn>::<provider id>`
        found.update(u for u in urns if u and not u.startswith(prefix))
    return sorted(found)


@dataclass
class Cli:
    """The `pulumi` CLI for one stack, run in the project's directory (`cwd`: the CLI reads Pulumi.yaml there and
    the stack's settings file, Pulumi.<stack>.yaml, beside it)."""
    pulumi: str
    stack: str
    env: Optional[dict] = None
    cwd: Optional[str] = None

    def run(self, *args: str, stdin: Optional[str] = None, stack: bool = True) -> subprocess.CompletedProcess:
        flags = ["--stack", self.stack, "--non-interactive"] if stack else ["--non-interactive"]
        try:
            return subprocess.run([self.pulumi, *args, *flags], input=stdin, capture_output=True, text=True,
                                  env=self.env, cwd=self.cwd)
        except OSError as e:
            raise RecoverError(f"can't run the pulumi CLI {self.pulumi!r} ({e.strerror}): put it on PATH or pass "
                               f"--pulumi PATH") from None

    def backend_url(self) -> str:
        done = self.run("whoami", "--json", stack=False)
        try:
            return json.loads(done.stdout).get("url") or ""
        except ValueError:
            raise RecoverError(f"`pulumi whoami --json` failed: {_tail(done)}") from None

    def export(self) -> tuple[str, dict[str, Any]]:
        """The stack's state as `pulumi stack export` prints it: the text and the document."""
        done = self.run("stack", "export")
        if done.returncode != 0:
            raise RecoverError(f"pulumi stack export --stack {self.stack} failed: {_tail(done)}")
        try:
            return done.stdout, json.loads(done.stdout)
        except ValueError:
            raise RecoverError(f"pulumi stack export --stack {self.stack} printed no JSON document") from None

    def import_state(self, document: dict[str, Any]) -> None:
        """`pulumi stack import` (read from stdin, pkg/cmd/pulumi/stack/stack_import.go) of `document`, which keeps
        the export's own `version`."""
        done = self.run("stack", "import", stdin=json.dumps(document))
        if done.returncode != 0:
            raise RecoverError(f"pulumi stack import --stack {self.stack} refused the resolved state; the state is "
                               f"unchanged:\n{_tail(done)}")

    def config(self, key: str) -> Optional[str]:
        """A stack config value (decrypted if secret; from the stack file or wherever the stack keeps it), None if
        unset (pkg/cmd/pulumi/config/config.go: "configuration key ... not found")."""
        done = self.run("config", "get", key, "--json")
        if done.returncode != 0:
            if "not found" in done.stderr:
                return None
            raise RecoverError(f"pulumi config get {key} --stack {self.stack} failed: {_tail(done)}")
        return json.loads(done.stdout).get("value")

    def update_in_progress_since(self) -> Optional[str]:
        """When the update the backend reports as still running started, "" if it reports none, None if it can't
        be asked (`pulumi stack history --json`: result `in-progress`, pkg/cmd/pulumi/stack/stack_history.go; only
        Pulumi Cloud records a running update)."""
        done = self.run("stack", "history", "--json", "--page-size", "5")
        try:
            updates = json.loads(done.stdout) if done.returncode == 0 else None
        except ValueError:
            updates = None
        if not isinstance(updates, list):
            return None
        return next((u.get("startTime") or "?" for u in updates if u.get("result") == "in-progress"), "")


def _tail(done: subprocess.CompletedProcess) -> str:
    return (done.stdout + done.stderr).strip()[-1500:]
