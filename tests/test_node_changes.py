"""Waits on a node woken by the API server's watch (kube/node_changes.py): a change to the node, to a pod bound to it
or to one of its ResourceSlices ends the wait's sleep at once; a change to another node does not; the watches stop
once nobody waits on them."""
import threading
import time

import pytest

from iks_gpu_migration.common.waiting import wait_for, waking_with
from iks_gpu_migration.kube import clients, node_changes
from tests.envtest import eventually


@pytest.fixture(autouse=True)
def short_watches(monkeypatch):
    monkeypatch.setattr(node_changes, "WATCH_SECONDS", 1)
    monkeypatch.setattr(node_changes, "WATCHES", node_changes._Watches())
    # Clients of this test only: a watch client another test built could expire (clients.TTL) between this test's
    # watch and its look at the watch pool.
    monkeypatch.setattr(clients, "_CLIENTS", clients._Clients())


def slept(sleep, seconds: float, change) -> float:
    """How long `sleep(seconds)` lasted when `change()` ran 0.3 s into it."""
    timer = threading.Timer(0.3, change)
    started = time.monotonic()
    timer.start()
    sleep(seconds)
    timer.join()
    return time.monotonic() - started


def test_a_change_to_the_node_its_pods_or_its_slices_ends_the_sleep(kube, kubeconfig):
    node, other = kube.name("n1"), kube.name("n2")
    kube.add_node(node)
    kube.add_node(other)
    ns = kube.ns("gpu-operator")
    with node_changes.woken_by_changes(kubeconfig, node, slices=True) as sleep:
        assert slept(sleep, 10, lambda: kube.patch_node(node, {"metadata": {"labels": {"a": "1"}}})) < 3
        assert slept(sleep, 10, lambda: kube.add_pod(ns, "driver", node=node)) < 3
        assert slept(sleep, 10, lambda: kube.add_slice(node, "gpu.nvidia.com", {"gpu-0": "GPU-1"})) < 3
        # Another node's changes and pods leave this wait asleep for its whole interval.
        assert slept(sleep, 1.5, lambda: (kube.patch_node(other, {"metadata": {"labels": {"a": "1"}}}),
                                          kube.add_pod(ns, "other", node=other))) >= 1.4


def test_waits_in_the_block_sleep_with_it_and_the_watches_stop_after(kube, kubeconfig):
    node = kube.name("n1")
    kube.add_node(node)
    polls = []

    def labelled():
        polls.append(time.monotonic())
        return "ready" in kube.labels(node), None, "not labelled"

    threading.Timer(0.5, lambda: kube.patch_node(node, {"metadata": {"labels": {"ready": "yes"}}})).start()
    started = time.monotonic()
    with node_changes.woken_by_changes(kubeconfig, node) as sleep, waking_with(sleep):
        wait_for("the label", labelled, timeout=60, interval=30)
    assert time.monotonic() - started < 5, "the wait slept its 30 s interval: no watch woke it"
    watches = list(node_changes.WATCHES.by_key.values())
    assert {w.kind for w in watches} == {"nodes", "pods"}
    assert clients.watch_client(kubeconfig).rest_client.pool_manager.pools, "the watches used the requests' pool"
    eventually(lambda: not any(w.running for w in watches), "the watches to stop once nobody waits", timeout=10)


def test_a_watch_that_fails_leaves_the_wait_to_its_interval(kube, monkeypatch):
    """No API server behind the kubeconfig: the watch fails and retries; the wait still polls and ends."""
    node = kube.name("n1")
    monkeypatch.setattr(node_changes, "RETRY_SECONDS", 0.1)
    with node_changes.woken_by_changes("/nonexistent/kubeconfig", node) as sleep:
        started = time.monotonic()
        sleep(0.5)
        assert 0.45 <= time.monotonic() - started < 2
        watch = node_changes.WATCHES.get("/nonexistent/kubeconfig", "nodes")
        eventually(lambda: watch.failures >= 2, "the failing watch to be retried")
