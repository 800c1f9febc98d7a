"""Migration status per GPU node: configured stage vs. what the cluster shows.

    python -m iks_gpu_migration.status --stack pilot [--kubeconfig PATH]

Reads `gpu-migration:nodes` from Pulumi.<stack>.yaml and, per node, prints the labels this program and the GPU
Operator use, whether it is cordoned, and the last verification recorded on it by SmokeTestVerification or
RollbackVerification (annotation migration.example.com/gpu-verification); then the migration plan (batches, budget).
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from ruamel.yaml import YAML

from .config import NAMESPACE, MigrationConfig, Node, TempGpuPool
from .kube_providers import VERIFICATION_ANNOTATION
from .plan import make_plan, parse_max_unavailable

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


def rows(config: dict, api) -> list[dict[str, str]]:
    """One row per configured node, in config order."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    pilot_key = str(config.get("pilotLabel") or MigrationConfig.model_fields["pilot_label"].default).partition("=")[0]
    core = client.CoreV1Api(api)
    out = []
    for entry in config.get("nodes") or []:
        row = {"node": entry["name"], "stage": entry.get("stage", "?")}
        try:
            node = core.read_node(entry["name"])
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


def plan_text(config: dict) -> str:
    """The plan `pulumi up` follows for these nodes and budget keys (iks_gpu_migration.plan), or why there is none."""
    try:
        nodes = [Node.model_validate(n) for n in config.get("nodes") or []]
        pool = TempGpuPool.model_validate(config.get("tempGpuPool") or {})
        surge = pool.size_per_zone if pool.enabled else 0
        plan = make_plan(nodes, parse_max_unavailable(config.get("maxUnavailable", 1)), surge,
                         float(config.get("batchSoakSeconds") or 0), pool.name)
    except ValueError as e:  # pydantic's ValidationError and PlanError are ValueErrors
        return f"no migration plan: {e}"
    return plan.render()


def status_text(stack: str, kubeconfig: Optional[str] = None, project_dir: Path = PROJECT_DIR) -> str:
    from kubernetes import config as kube_config

    config = stack_config(Path(project_dir) / f"Pulumi.{stack}.yaml")
    with kube_config.new_client_from_config(config_file=kubeconfig or config.get("kubeconfig") or None) as api:
        return f"{table(rows(config, api))}\n\n{plan_text(config)}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iks_gpu_migration.status", description=__doc__.split("\n")[0])
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument("--kubeconfig", help="default: gpu-migration:kubeconfig, then KUBECONFIG / ~/.kube/config")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR)
    args = parser.parse_args(argv)
    print(status_text(args.stack, args.kubeconfig, args.project_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
