"""What the program records on Node objects: the last verification (read by `status`) and the config entry a replaced
node belongs to (read by the inventory, the capacity gates and resumed replacements)."""
import json
from datetime import datetime, timezone
from typing import Any

import pulumi
from kubernetes import client

from .provider import _short


VERIFICATION_ANNOTATION = "migration.example.com/gpu-verification"


def _record(api, node: str, record: dict[str, Any]) -> str:
    """Store the last verification on the node, for `python -m iks_gpu_migration.cli.status`.

    Never raises: failing to record must not replace the verification's own result. Returns "" or a sentence to
    append to that result's message."""
    record = {**record, "checkedAt": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    body = {"metadata": {"annotations": {VERIFICATION_ANNOTATION: json.dumps(record, sort_keys=True)}}}
    try:
        client.CoreV1Api(api).patch_node(node, body)
    except Exception as e:  # noqa: BLE001 - any failure here is secondary to the verification
        note = (f"(the result could not be recorded on node {node} as {VERIFICATION_ANNOTATION}: {_short(e)}; "
                f"`python -m iks_gpu_migration.cli.status` shows an older verification)")
        pulumi.log.warn(note)
        return note
    return ""


def _last_record(api, node: str) -> dict[str, Any]:
    raw = (client.CoreV1Api(api).read_node(node).metadata.annotations or {}).get(VERIFICATION_ANNOTATION)
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}


# Set by the switch's readiness step (kube/readiness.py) on a replaced node: the config entry it belongs to (its name may differ).
CONFIG_NAME_ANNOTATION = "migration.example.com/gpu-node"


# Set by the drain before a worker replacement (kube/eviction.py): what went and what stayed, read by `status`.
DRAIN_ANNOTATION = "migration.example.com/drained"


def record_drain(api, node: str, result: dict[str, Any]) -> str:
    """Never raises, like _record: returns "" or a sentence saying the record is missing."""
    record = {**{k: v for k, v in result.items() if v}, "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    try:
        client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {DRAIN_ANNOTATION: json.dumps(record)}}})
    except Exception as e:  # noqa: BLE001 - the drain happened; failing to record it must not undo that
        note = f"(the drain could not be recorded on node {node} as {DRAIN_ANNOTATION}: {_short(e)})"
        pulumi.log.warn(note)
        return note
    return ""
