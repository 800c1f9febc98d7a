"""The nodes this provider process saw finish, for the slots' gates and drains (components/slots.py).

A node's gate and drain re-check count the nodes in flight beside it (its `peers`, fixed when its slot came) as out
by admission. A peer that finishes later is back in service; counted out still, it would hold the budget short for
the rest of the run (with one GPU node cordoned by someone else, the next gate would never open). Every dynamic
resource of a stack runs in one provider host process (sdk_workarounds.widen_provider_host), so a node's last step
records here that it finished, and the gates and drains that poll later count it as what it is. A new `up` starts
empty: its slots are handed out from the program's own view, in which finished nodes are never peers.
"""
import threading
from typing import Iterable, Sequence

from ..plan.gates import NodeView

_LOCK = threading.Lock()
_FINISHED: set[str] = set()


def record(*names: str) -> None:
    """A node's last step passed: its configured name and its node's name now."""
    with _LOCK:
        _FINISHED.update(n for n in names if n)


def in_flight(peers: Iterable[str], views: Sequence[NodeView]) -> list[str]:
    """`peers` without the ones that finished: by their configured name, or by their node's name now (a replaced
    node carries its entry's name: NodeView.config_name)."""
    with _LOCK:
        done = set(_FINISHED)
    by_entry = {v.config_name: v.name for v in views if v.config_name}
    return [p for p in peers if p not in done and by_entry.get(p) not in done]
