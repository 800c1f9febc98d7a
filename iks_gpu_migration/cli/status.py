"""Migration status per GPU node: configured stage vs. what the cluster shows.

    python -m iks_gpu_migration.cli.status --stack pilot [--kubeconfig PATH] [--outputs FILE] [--json]

Reads `gpu-migration:*` from Pulumi.<stack>.yaml and the stack outputs (`pulumi stack output --json`, or --outputs FILE)
to find each node under its real name after replacement (output node:<key or name>.nodeName, so the config never has
to be renamed), then shows per node: worker ID and kubelet version, the
configured stage and how far the node is through it, whether it is cordoned, and the last verification recorded on it
by SmokeTestVerification or the switch's rollback check (annotation migration.example.com/gpu-verification); then the
migration plan (order, slots, budget: iks_gpu_migration.plan) and which nodes hold the slots now and which wait.
The stack file is validated first, as `pulumi preview` validates it (an invalid one: the same lines). Every other
failure is one line on stderr naming what to fix; exit code 1.
"""
import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from ..common.versions import version_at_least
from ..config import MigrationConfig, Node, TempGpuPool
from ..kube.labels import DEVICE_PLUGIN_OFF, IBM_MANAGED_LABELS, OPERANDS_OFF
from ..kube.records import DRAIN_ANNOTATION, VERIFICATION_ANNOTATION
from ..plan import make_plan, parse_max_unavailable
from .status_inputs import (PROJECT_DIR, StatusError, Unreachable, kubeconfig_path, load_outputs, load_stack,
                            local_environment_hint, validate)
# Also as status.X (tests/harness.py, tests/test_status.py).
from .status_inputs import local_session_cli, program_view, stack_config  # noqa: F401

OPERATOR_LABELS = ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.operands",
                   "nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.present")
COLUMNS = ("node", "worker", "kube", "stage", "progress", "cordoned", "drained", "verification")
REQUEST_TIMEOUT = 15  # seconds per API call: status must answer, not hang on an unreachable server
DEFAULTS = {name: f.default for name, f in MigrationConfig.model_fields.items()}


def connect(path: str):
    from kubernetes.config.config_exception import ConfigException

    from ..kube.clients import new_client  # bounded requests, a renewable exec/tokenFile credential

    try:
        # One retry: the client's urllib3 default retries a dead server three times.
        return new_client(path, retries=1)
    except (ConfigException, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise StatusError(f"kubeconfig {path} is not usable ({' '.join(str(e).split()) or type(e).__name__}); "
                          f"pass --kubeconfig PATH") from None


# --- reading the cluster ----------------------------------------------------------------------------------------


def _kubernetes_status(body: Any) -> Optional[dict]:
    """The body of an API error if it is a Kubernetes Status object (apimachinery metav1.Status), else None."""
    try:
        data = json.loads(body) if isinstance(body, (str, bytes)) else None
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("kind") == "Status" else None


def read_node(core, name: str, server: str):
    """The Node, or None if the API server says it does not exist; StatusError for anything else."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return core.read_node(name, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as e:
        status = _kubernetes_status(e.body)
        if e.status == 404 and status and status.get("reason") == "NotFound":
            return None
        if status is None:
            raise StatusError(f"{server} answered HTTP {e.status} {e.reason or ''} to GET /api/v1/nodes/{name}, "
                              f"which is not a Kubernetes API answer: does the kubeconfig point at the cluster's API "
                              f"server? (pass --kubeconfig PATH)") from None
        if e.status == 403:  # authenticated, but RBAC refused: the message names user, verb and resource
            raise StatusError(f"the API server at {server} refused access (403: {status.get('message')}); `status` "
                              f"needs `get` on nodes: bind the kubeconfig's identity to the ClusterRole "
                              f"gpu-migration-status (iks_gpu_migration/rbac/gpu-migration-status.yaml, "
                              f"docs/permissions.md) or pass --kubeconfig PATH") from None
        if e.status == 401:
            raise StatusError(f"the API server at {server} refused access ({e.status}: {status.get('message')}); "
                              f"refresh the kubeconfig (`ibmcloud ks cluster config --cluster <cluster>`) or pass "
                              f"--kubeconfig PATH") from None
        raise StatusError(f"the API server at {server} answered {e.status} for node {name}: "
                          f"{status.get('message')}") from None
    except HTTPError as e:
        reason = getattr(e, "reason", None) or e
        raise Unreachable(f"cannot reach the Kubernetes API server at {server}: {' '.join(str(reason).split())}; "
                          f"check the network/VPN or pass --kubeconfig PATH") from None


# --- deciding what to show (pure) -------------------------------------------------------------------------------


@dataclass
class NodeFacts:
    """What the cluster shows of one node (None: not found)."""
    labels: dict[str, str] = field(default_factory=dict)
    kubelet: str = ""
    cordoned: bool = False
    allocatable: dict[str, str] = field(default_factory=dict)
    verification: Optional[dict] = None
    drained: Optional[dict] = None  # the drain recorded on the node (before its worker was replaced)
    ready: bool = True  # its kubelet's Ready condition is True


def node_facts(node) -> Optional[NodeFacts]:
    if node is None:
        return None
    annotation = (node.metadata.annotations or {}).get(VERIFICATION_ANNOTATION)
    info = node.status.node_info if node.status else None
    return NodeFacts(labels=dict(node.metadata.labels or {}), kubelet=(info.kubelet_version if info else "") or "",
                     cordoned=bool(node.spec and node.spec.unschedulable),
                     allocatable=dict((node.status.allocatable if node.status else None) or {}),
                     verification=parse_verification(annotation),
                     drained=parse_verification((node.metadata.annotations or {}).get(DRAIN_ANNOTATION)),
                     ready=any(c.type == "Ready" and c.status == "True"
                               for c in ((node.status.conditions if node.status else None) or [])))


def parse_verification(raw: Optional[str]) -> Optional[dict]:
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except json.JSONDecodeError:
        return {"result": "unreadable", "raw": raw[:60]}
    return record if isinstance(record, dict) else {"result": "unreadable", "raw": raw[:60]}


def progress(stage: str, facts: NodeFacts, kube_version: str, pilot: tuple[str, str],
             device_plugin_resource: str) -> list[tuple[str, bool]]:
    """The steps of `stage` in order, each with whether the node shows it done."""
    labels = facts.labels
    has = lambda wanted: all(labels.get(k) == v for k, v in wanted.items())
    if stage == "ibm-managed":
        # Only deploy.operands=false lasts: the GPU Operator then deletes deploy.driver (see kube/labels.py).
        return [("operator fenced off", has(OPERANDS_OFF))]
    replaced = ("worker replaced", version_at_least(facts.kubelet, kube_version))
    record = facts.verification or {}
    if stage == "dra":
        return [replaced,
                ("dra labels", has({pilot[0]: pilot[1], **DEVICE_PLUGIN_OFF})),
                ("smoke test passed", record.get("path") == "dra" and record.get("result") == "passed"),
                ("schedulable", not facts.cordoned)]
    if stage == "device-plugin":
        # No pilot label and no switch left off. The GPU Operator itself labels GPU nodes with deploy.*=true, and a
        # rollback sets deploy.device-plugin=true explicitly (kube/switch.py): only the "false" values are leftovers.
        switched_off = {**DEVICE_PLUGIN_OFF, **IBM_MANAGED_LABELS}
        leftovers = pilot[0] in labels or any(labels.get(k) == v for k, v in switched_off.items())
        offered = _int(facts.allocatable.get(device_plugin_resource)) > 0
        return [replaced,
                ("device-plugin labels", not leftovers),
                (f"{device_plugin_resource} allocatable", offered),
                ("schedulable", not facts.cordoned)]
    return []


def _int(value: Optional[str]) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def describe_progress(steps: list[tuple[str, bool]]) -> str:
    done = sum(1 for _, ok in steps if ok)
    pending = [name for name, ok in steps if not ok]
    return f"{done}/{len(steps)}" + (f" (next: {pending[0]})" if pending else " done")


def describe_verification(record: Optional[dict]) -> str:
    if not record:
        return "-"
    if record.get("result") == "unreadable":
        return f"unreadable: {record.get('raw')}"
    text = f"{record.get('result', '?')} {record.get('path', '?')} at {record.get('checkedAt', '?')}"
    if record.get("problems"):
        text += f": {str(record['problems'][0]).strip()[:80]}"
    return text


def describe_drain(record: Optional[dict]) -> str:
    """Counts of what the last drain before a replacement moved; `--json` lists every pod."""
    if not record:
        return "-"
    parts = [f"{len(record[k])} {label}" for k, label in (("evicted", "evicted"), ("deleted", "deleted"),
             ("notAwaited", "not awaited"), ("cameBack", "came back")) if isinstance(record.get(k), list) and record[k]]
    return ", ".join(parts) or "nothing to move"


def node_status(entry: dict, output: dict, facts: Optional[NodeFacts], config: dict) -> dict[str, Any]:
    """One node's status as JSON-ready data. The drain: as the replacement recorded it in the stack outputs, else
    as recorded on the node (a drain whose replacement has not happened yet)."""
    stage = entry.get("stage", "?")
    name = output.get("nodeName") or entry.get("name")
    out: dict[str, Any] = {
        "node": name, "configuredName": entry.get("name"), "stage": stage,
        "workerId": output.get("replacedWorkerId") or entry.get("workerId"),
        "found": facts is not None,
        "drained": output.get("drained") or (facts.drained if facts is not None else None),
    }
    if facts is None:
        return {**out, "kubeVersion": None, "cordoned": None, "labels": {}, "steps": [], "verification": None}
    pilot_key, _, pilot_value = str(config.get("pilotLabel") or DEFAULTS["pilot_label"]).partition("=")
    # The device plugin's name is its own (always under nvidia.com/), not extendedResourceName.
    resource = config.get("devicePluginResourceName") or DEFAULTS["device_plugin_resource_name"]
    steps = progress(stage, facts, str(config.get("kubeVersion") or ""), (pilot_key, pilot_value), resource)
    shown = {k: facts.labels[k] for k in (pilot_key, *OPERATOR_LABELS) if k in facts.labels}
    return {**out, "kubeVersion": facts.kubelet or None, "cordoned": facts.cordoned, "ready": facts.ready,
            "labels": shown,
            "steps": [{"step": s, "done": ok} for s, ok in steps], "verification": facts.verification}


def table_row(status: dict) -> dict[str, str]:
    node = status["node"]
    if status["configuredName"] != node:
        node += f" (was {status['configuredName']})"
    if not status["found"]:
        return {"node": node, "worker": status["workerId"] or "-", "kube": "-", "stage": status["stage"],
                "progress": "node not found", "cordoned": "-", "drained": describe_drain(status.get("drained")),
                "verification": "-"}
    steps = [(s["step"], s["done"]) for s in status["steps"]]
    return {"node": node, "worker": status["workerId"] or "-", "kube": status["kubeVersion"] or "-",
            "stage": status["stage"],
            "progress": (describe_progress(steps) if steps else "-") + ("" if status.get("ready", True) else
                                                                        ", NotReady"),
            "cordoned": "yes" if status["cordoned"] else "no", "drained": describe_drain(status.get("drained")),
            "verification": describe_verification(status["verification"])}


def table(data: list[dict[str, str]]) -> str:
    widths = {c: max([len(c), *(len(r[c]) for r in data)]) for c in COLUMNS}
    lines = [[c.upper() for c in COLUMNS], *([r[c] for c in COLUMNS] for r in data)]
    return "\n".join("  ".join(v.ljust(widths[c]) for c, v in zip(COLUMNS, line)).rstrip() for line in lines)


def plan_of(config: dict):
    """The plan `pulumi up` follows for these nodes and budget keys (iks_gpu_migration.plan); ValueError if none."""
    nodes = [Node.model_validate(n) for n in config.get("nodes") or []]
    pool = TempGpuPool.model_validate(config.get("tempGpuPool") or {})
    surge = pool.size_per_zone if pool.enabled else 0
    return make_plan(nodes, parse_max_unavailable(config.get("maxUnavailable", 1)), surge,
                     float(config.get("batchSoakSeconds") or 0), pool.name)


def plan_text(config: dict) -> str:
    """The plan, or why there is none."""
    try:
        return plan_of(config).render()
    except ValueError as e:  # pydantic's ValidationError and PlanError are ValueErrors
        return f"no migration plan: {e}"


def turn_of(status: dict) -> str:
    """Where a node past ibm-managed is in the run as the cluster shows it: done (every step shown), waiting (nothing
    started: no step shown, not cordoned), else in flight (a slot taken: cordoned, its node gone while its worker is
    replaced, or part of its steps shown)."""
    steps = [s["done"] for s in status["steps"]]
    if status["found"] and steps and all(steps):
        return "done"
    if status["found"] and not status["cordoned"] and not any(steps):
        return "waiting" if status.get("ready", True) else "NotReady"
    return "in flight"


def turns_text(config: dict, statuses: list[dict]) -> str:
    """Which nodes hold the slots now and which node waits for what (the same order `up` follows: plan/slots.py)."""
    try:
        plan = plan_of(config)
    except ValueError:
        return ""
    turn = {s["configuredName"]: turn_of(s) for s in statuses}
    in_flight = [t.node for t in plan.batches if turn.get(t.node) == "in flight"]
    waiting = [t.node for t in plan.batches if turn.get(t.node) == "waiting"]
    broken = [t.node for t in plan.batches if turn.get(t.node) == "NotReady"]
    if not in_flight and not waiting and not broken:
        return "now: every node is at its stage"
    text = f"now: {len(in_flight)} of {plan.slots} slot(s) taken" + (f" ({', '.join(in_flight)})" if in_flight else "")
    if broken:  # out already: they count against the budget and take the first slots (kube/inventory.py out_already)
        text += f"; NotReady, first in line: {', '.join(broken)}"
    if waiting:
        why = ("waits for a node in flight to be done" if len(in_flight) >= plan.slots
               else "may start now (a slot is free; its gate counts capacity first)")
        more = f"; {len(waiting) - 1} more wait after it" if len(waiting) > 1 else ""
        text += f"; next: {waiting[0]} {why}{more}"
    return text


# --- doing ------------------------------------------------------------------------------------------------------


def collect(stack: str, kubeconfig: Optional[str] = None, project_dir: Path = PROJECT_DIR,
            outputs_file: Optional[Path] = None) -> dict[str, Any]:
    """{"stack", "notes", "nodes": [node_status...]}, in config order; StatusError if it cannot be shown."""
    from kubernetes import client

    config = load_stack(project_dir, stack)
    hint = local_environment_hint(config, project_dir, stack)
    if hint and config.get("kubeconfig") and not (Path(project_dir) / str(config["kubeconfig"])).is_file():
        raise StatusError(hint)  # never started here: its kubeconfig is made by `start`
    validate(project_dir, stack)
    outputs, notes = load_outputs(stack, outputs_file, project_dir)
    path = kubeconfig_path(kubeconfig, config, project_dir)
    nodes = []
    with connect(path) as api:
        core, server = client.CoreV1Api(api), api.configuration.host
        for entry in config["nodes"]:
            # Outputs are keyed by the entry's key (else its name): node:<key>.nodeName is the node now.
            output = outputs.get(f"node:{entry.get('key') or entry.get('name')}") or {}
            output = output if isinstance(output, dict) else {}
            name = output.get("nodeName") or entry.get("name")
            try:
                facts = node_facts(read_node(core, str(name), server))
            except Unreachable:
                if hint:  # a stopped local environment, not the network
                    raise StatusError(hint) from None
                raise
            nodes.append(node_status(entry, output, facts, config))
    plan = "\n".join(filter(None, [plan_text(config), turns_text(config, nodes)]))
    return {"stack": stack, "kubeconfig": path, "notes": notes, "nodes": nodes, "plan": plan}


def status_text(stack: str, kubeconfig: Optional[str] = None, project_dir: Path = PROJECT_DIR,
                outputs_file: Optional[Path] = None) -> str:
    data = collect(stack, kubeconfig, project_dir, outputs_file)
    return f"{table([table_row(n) for n in data['nodes']])}\n\n{data['plan']}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iks_gpu_migration.cli.status", description=__doc__.split("\n")[0])
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml and its outputs")
    parser.add_argument("--kubeconfig", help="default: gpu-migration:kubeconfig, then KUBECONFIG / ~/.kube/config")
    parser.add_argument("--outputs", type=Path, help="JSON of `pulumi stack output --json` (default: run it if the "
                                                     "pulumi CLI is on PATH)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR)
    args = parser.parse_args(argv)
    try:
        data = collect(args.stack, args.kubeconfig, args.project_dir, args.outputs)
    except StatusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    for note in data["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(table([table_row(n) for n in data["nodes"]]))
    print(f"\n{data['plan']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
