"""Migration status per GPU node: configured stage vs. what the cluster shows.

    python -m iks_gpu_migration.status --stack pilot [--kubeconfig PATH] [--outputs FILE]

Reads `gpu-migration:nodes` from Pulumi.<stack>.yaml and the stack outputs (`pulumi stack output --json`, or FILE):
a replaced node is looked up under the node name recorded in state (output node:<key>.nodeName), so the config
never has to be renamed after a replacement. Per node it prints the labels this program and the GPU
Operator use, whether it is cordoned, and the last verification recorded on it by SmokeTestVerification or
RollbackVerification (annotation migration.example.com/gpu-verification).
"""
import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from ruamel.yaml import YAML

from .config import MigrationConfig, NAMESPACE
from .kube_providers import VERIFICATION_ANNOTATION

PROJECT_DIR = Path(__file__).resolve().parents[1]
OPERATOR_LABELS = ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.operands",
                   "nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.present")
COLUMNS = ("node", "stage", "labels", "cordoned", "verification")


def stack_config(path: Path) -> dict:
    """The `gpu-migration:*` keys of a stack file, without the namespace prefix."""
    config = (YAML(typ="safe").load(path.read_text()) or {}).get("config") or {}
    return {k.partition(":")[2]: v for k, v in config.items() if k.startswith(f"{NAMESPACE}:")}


def describe_verification(raw: Optional[str]) -> str:
    if not raw:
        return "-"
    try:
        record = json.loads(raw)
    except json.JSONDecodeError:
        return f"unreadable: {raw[:60]}"
    text = f"{record.get('result', '?')} ({record.get('path', '?')}, {record.get('checkedAt', '?')})"
    if record.get("gpu"):
        text += f" {record['gpu']}"
    if record.get("problems"):
        text += f": {record['problems'][0]}"
    return text


def stack_outputs(stack: str, project_dir: Path) -> dict:
    """`pulumi stack output --json` of the stack; {} (with a note on stderr) when the CLI or the stack is not there."""
    pulumi_cli = shutil.which("pulumi")
    if not pulumi_cli:
        print("note: pulumi CLI not found; replaced nodes are looked up under their configured names", file=sys.stderr)
        return {}
    done = subprocess.run([pulumi_cli, "stack", "output", "--json", "--stack", stack, "--cwd", str(project_dir)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        print(f"note: no stack outputs ({done.stderr.strip()[:200]}); replaced nodes are looked up under their "
              f"configured names", file=sys.stderr)
        return {}
    return json.loads(done.stdout or "{}")


def current_node(entry: dict, outputs: dict) -> str:
    """The node name recorded in state for this entry (by its key), else the configured name."""
    recorded = outputs.get(f"node:{entry.get('key') or entry['name']}") or {}
    return recorded.get("nodeName") or entry["name"]


def rows(config: dict, api, outputs: Optional[dict] = None) -> list[dict[str, str]]:
    """One row per configured node, in config order."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    pilot_key = str(config.get("pilotLabel") or MigrationConfig.model_fields["pilot_label"].default).partition("=")[0]
    core = client.CoreV1Api(api)
    out = []
    for entry in config.get("nodes") or []:
        name = current_node(entry, outputs or {})
        shown_name = entry["name"] if name == entry["name"] else f"{entry['name']}->{name}"
        row = {"node": shown_name, "stage": entry.get("stage", "?")}
        try:
            node = core.read_node(name)
        except ApiException as e:
            if e.status != 404:
                raise
            out.append({**row, "labels": "node not found", "cordoned": "-", "verification": "-"})
            continue
        labels = node.metadata.labels or {}
        shown = [f"{k}={labels[k]}" for k in (pilot_key, *OPERATOR_LABELS) if k in labels]
        annotation = (node.metadata.annotations or {}).get(VERIFICATION_ANNOTATION)
        out.append({**row, "labels": ", ".join(shown) or "-", "cordoned": "yes" if node.spec.unschedulable else "no",
                    "verification": describe_verification(annotation)})
    return out


def table(data: list[dict[str, str]]) -> str:
    widths = {c: max([len(c), *(len(r[c]) for r in data)]) for c in COLUMNS}
    lines = [[c.upper() for c in COLUMNS], *([r[c] for c in COLUMNS] for r in data)]
    return "\n".join("  ".join(v.ljust(widths[c]) for c, v in zip(COLUMNS, line)).rstrip() for line in lines)


def status_text(stack: str, kubeconfig: Optional[str] = None, project_dir: Path = PROJECT_DIR,
                outputs: Optional[dict] = None) -> str:
    from kubernetes import config as kube_config

    config = stack_config(Path(project_dir) / f"Pulumi.{stack}.yaml")
    if outputs is None:
        outputs = stack_outputs(stack, Path(project_dir))
    with kube_config.new_client_from_config(config_file=kubeconfig or config.get("kubeconfig") or None) as api:
        return table(rows(config, api, outputs))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iks_gpu_migration.status", description=__doc__.split("\n")[0])
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument("--kubeconfig", help="default: gpu-migration:kubeconfig, then KUBECONFIG / ~/.kube/config")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR)
    parser.add_argument("--outputs", type=Path, help="JSON of `pulumi stack output --json` (default: run it)")
    args = parser.parse_args(argv)
    outputs = json.loads(args.outputs.read_text()) if args.outputs else None
    print(status_text(args.stack, args.kubeconfig, args.project_dir, outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
