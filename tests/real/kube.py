"""Small helpers for tests against the real API server."""
import time
from typing import Callable, TypeVar

from kubernetes.client import ApiException

from gpu_migration_local.iks_nodes import node_info, node_resources

T = TypeVar("T")


def eventually(check: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.2) -> T:
    """Polls until `check` returns a truthy value; the timeout names what was awaited and the last value seen."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AttributeError, TypeError, KeyError, IndexError, ApiException) as e:  # not there yet
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last!r}")


def kwok_node(name: str, labels: dict, annotations: dict | None = None, kubelet_version: str = "v1.37.2",
              taints: list | None = None) -> dict:
    """A Node played by kwok (annotation kwok.x-k8s.io/node=fake), as the local IKS cluster creates them."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels},
                     "annotations": {"kwok.x-k8s.io/node": "fake", **(annotations or {})}},
        "spec": {"taints": taints or []},
        "status": {"nodeInfo": node_info(kubelet_version), **node_resources()},
    }
