"""Cordons this program sets and removes. A cordon it sets carries CORDON_ANNOTATION; only such a cordon is undone by
the program, so a node an admin cordoned stays cordoned."""
from typing import Optional

from kubernetes import client



UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


CORDON_ANNOTATION = "migration.example.com/cordoned-for"


def _set_unschedulable(api, node: str, unschedulable: bool) -> None:
    client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": unschedulable or None}})


def cordon(api, node: str, reason: str) -> None:
    core = client.CoreV1Api(api)
    current = core.read_node(node)
    if current.spec.unschedulable and not (current.metadata.annotations or {}).get(CORDON_ANNOTATION):
        return  # cordoned by someone else: leave it to them
    core.patch_node(node, {"metadata": {"annotations": {CORDON_ANNOTATION: reason}}, "spec": {"unschedulable": True}})


def cordoned_for(api, node: str) -> Optional[str]:
    """Why this program cordoned `node` (the reason `cordon` recorded), or None."""
    return (client.CoreV1Api(api).read_node(node).metadata.annotations or {}).get(CORDON_ANNOTATION)


def uncordon_if_ours(api, node: str) -> bool:
    if not cordoned_for(api, node):
        return False
    client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {CORDON_ANNOTATION: None}},
                                            "spec": {"unschedulable": None}})
    return True
