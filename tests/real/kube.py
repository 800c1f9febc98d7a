"""Small helpers for tests against the real API server."""
import threading
import time
from typing import Callable, TypeVar

from kubernetes import client
from kubernetes.client import ApiException

from gpu_migration_local.gpu_doubles import GPUS_ANNOTATION
from gpu_migration_local.iks_nodes import node_info, node_resources

GPU_PRESENT = "nvidia.com/gpu.present"  # the GPU Operator's label of a node with NVIDIA GPUs

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
    """A Node played by kwok (annotation kwok.x-k8s.io/node=fake), as the local IKS cluster creates them. A node
    labelled nvidia.com/gpu.present=true (as the GPU Operator labels one) has one GPU for the doubles."""
    gpus = {GPUS_ANNOTATION: "1"} if labels.get(GPU_PRESENT) == "true" else {}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels},
                     "annotations": {"kwok.x-k8s.io/node": "fake", **gpus, **(annotations or {})}},
        "spec": {"taints": taints or []},
        "status": {"nodeInfo": node_info(kubelet_version), **node_resources()},
    }


class ReadyReplicas:
    """Samples a Deployment's ready replicas every 50 ms while the `with` block runs (e.g. a drain under its PDB)."""

    def __init__(self, api, namespace: str, name: str) -> None:
        apps, self.seen, self._stop = client.AppsV1Api(api), [], threading.Event()

        def run():
            while not self._stop.is_set():
                self.seen.append(apps.read_namespaced_deployment(name, namespace).status.ready_replicas or 0)
                time.sleep(0.05)
        self._thread = threading.Thread(target=run, daemon=True)

    def __enter__(self) -> "ReadyReplicas":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
