"""What `status` reads before the cluster (cli/status.py): the stack file (validated as `pulumi preview` validates
it), the stack outputs (from a running local session's CLI, the one on PATH, or --outputs FILE) and the kubeconfig."""
import contextlib
import json
import os
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Optional

import yaml

from ..config import NAMESPACE, ConfigError, parse
from ..config.loading import SECRET_KEYS

PROJECT_DIR = Path(__file__).resolve().parents[2]


class StatusError(Exception):
    """Status cannot be shown; the message is one line that says what to do."""


class Unreachable(StatusError):
    """The API server did not answer at all."""


# --- inputs: stack config, stack outputs, kubeconfig ------------------------------------------------------------


def stack_config(path: Path) -> dict:
    """The `gpu-migration:*` keys of a stack file, without the namespace prefix."""
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    return {k.partition(":")[2]: v for k, v in config.items() if k.startswith(f"{NAMESPACE}:")}


def load_stack(project_dir: Path, stack: str) -> dict:
    path = Path(project_dir) / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in Path(project_dir).glob("Pulumi.*.yaml"))
        raise StatusError(f"unknown stack {stack!r}: no {path.name} in {project_dir} "
                          f"(stacks here: {', '.join(known) or 'none'})")
    try:
        config = stack_config(path)
    except (yaml.YAMLError, AttributeError) as e:
        raise StatusError(f"{path} is not a readable stack file: {' '.join(str(e).split())}") from None
    if not isinstance(config.get("nodes"), list):
        raise StatusError(f"{path} has no gpu-migration:nodes list")
    return config


def program_view(path: Path) -> dict:
    """The `gpu-migration:*` keys as the program gets them from the CLI (config/loading.py raw_from_pulumi): a
    top-level scalar as a string, as the CLI hands it over (`pulumi config --json`, CLI 3.274: the text in the file,
    a number as Go prints it: `kubeVersion: 1.30` is "1.3"), objects and lists as YAML reads them (an unquoted
    `version: 25.10` in one is the number 25.1 to the program too)."""
    loader = yaml.SafeLoader(path.read_text())
    try:
        root = loader.get_single_node()
        config = next((v for k, v in (root.value if isinstance(root, yaml.MappingNode) else [])
                       if k.value == "config"), None)
        pairs = config.value if isinstance(config, yaml.MappingNode) else []
        return {k.value.partition(":")[2]: _scalar_text(v) if isinstance(v, yaml.ScalarNode) else
                loader.construct_object(v, deep=True) for k, v in pairs if k.value.startswith(f"{NAMESPACE}:")}
    finally:
        loader.dispose()


def _scalar_text(node: yaml.ScalarNode) -> str:
    if node.tag == "tag:yaml.org,2002:float" and not node.style:  # an unquoted number with a fraction
        try:
            return repr(float(node.value))
        except ValueError:
            return node.value
    return node.value


def validate(project_dir: Path, stack: str) -> None:
    """The stack file's config as `pulumi preview` validates it (config.parse, in the project directory, where the CLI
    runs the program: relative paths resolve there), so status never shows progress against a misspelt key."""
    try:
        with contextlib.chdir(project_dir):
            raw = program_view(Path(project_dir) / f"Pulumi.{stack}.yaml")
            parse({k: v for k, v in raw.items() if k not in SECRET_KEYS})  # secrets: read on their own
    except ConfigError as e:
        raise StatusError(str(e)) from None


def local_environment_hint(config: dict, project_dir: Path, stack: str) -> Optional[str]:
    """For a stack of the local environment (gpu_migration_local: IBM Cloud on 127.0.0.1) whose session is not
    running, what to do instead of checking the network; None otherwise."""
    ibm = config.get("ibmCloud") if isinstance(config.get("ibmCloud"), dict) else {}
    host = urllib.parse.urlsplit(str(ibm.get("endpoint") or "")).hostname
    if host not in ("127.0.0.1", "localhost", "::1") or local_session_cli(project_dir, stack) is not None:
        return None
    project = "" if Path(project_dir).resolve() == PROJECT_DIR else f" --project {project_dir}"
    return (f"no local environment is running for stack {stack}: start it with `venv/bin/python -m "
            f"gpu_migration_local{project} start` (docs/operations.md#rehearse-locally)")


def local_session_cli(project_dir: Path, stack: str) -> Optional[tuple[str, dict[str, str]]]:
    """The Pulumi CLI and environment of a running local session of `stack` (gpu_migration_local/session.py writes
    <project>/.local/session.json while it runs), so `status --stack local` reads its outputs without the shell's
    `eval` of its environment; None otherwise."""
    try:
        record = json.loads((Path(project_dir) / ".local" / "session.json").read_text())
        os.kill(int(record["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("stack") != stack or not record.get("pulumi"):
        return None
    return record["pulumi"], {**os.environ, **record.get("env", {})}


def load_outputs(stack: str, outputs_file: Optional[Path], project_dir: Path) -> tuple[dict, list[str]]:
    """Stack outputs and notes on what could not be read (status then shows configured names only)."""
    if outputs_file is not None:
        try:
            return json.loads(Path(outputs_file).read_text()), []
        except (OSError, json.JSONDecodeError) as e:
            raise StatusError(f"--outputs {outputs_file}: not a JSON file from `pulumi stack output --json` ({e})")
    pulumi, env = local_session_cli(project_dir, stack) or (shutil.which("pulumi"), None)
    if pulumi is None:
        return {}, ["pulumi CLI not on PATH: showing configured node names; pass --outputs FILE (from `pulumi stack "
                    "output --json --stack S`) to see replaced nodes under their new names"]
    try:
        done = subprocess.run([pulumi, "stack", "output", "--json", "--stack", stack], cwd=project_dir,
                              capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return {}, ["`pulumi stack output` did not answer within 120s: showing configured node names"]
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return {}, [f"`pulumi stack output --stack {stack}` failed ({reason}): showing configured node names"]
    try:
        return json.loads(done.stdout or "{}"), []
    except json.JSONDecodeError:
        return {}, ["`pulumi stack output --json` printed no JSON: showing configured node names"]


def kubeconfig_path(arg: Optional[str], config: dict, project_dir: Optional[Path] = None) -> str:
    """--kubeconfig, then gpu-migration:kubeconfig (a relative path from the project directory, where the CLI runs the
    program), then KUBECONFIG (first entry), then ~/.kube/config."""
    if arg:
        source = "--kubeconfig"
    elif config.get("kubeconfig"):
        arg, source = config["kubeconfig"], "gpu-migration:kubeconfig"
    elif os.environ.get("KUBECONFIG"):
        arg, source = os.environ["KUBECONFIG"].split(os.pathsep)[0], "KUBECONFIG"
    else:
        arg, source = "~/.kube/config", "the default"
    path = os.path.expanduser(arg)
    if source == "gpu-migration:kubeconfig" and project_dir is not None:
        path = os.path.join(project_dir, path)  # unchanged when absolute
    if not os.path.isfile(path):
        raise StatusError(f"kubeconfig {path} (from {source}) does not exist; pass --kubeconfig PATH "
                          f"(for IKS: `ibmcloud ks cluster config --cluster <cluster>` writes one)")
    return path
