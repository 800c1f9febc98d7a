"""Issue 36 point 1 (and issue 17 point 3 before it): the canary per pool and zone. In each worker pool and zone the
run's first replacement must bring its new worker to deployed and Ready before any other replaceWorker there goes
(iks/pool_rules.py Canaries), against the IKS emulator."""
import threading
import time

import pytest

from iks_gpu_migration.common.waiting import WaitTimeout
from iks_gpu_migration.iks.provider import ReplacementError
from tests.emulators.iks import IksEmulator
from tests.test_iks_providers import live_workers, replace, replace_together


@pytest.fixture
def emu():
    emulator = IksEmulator(master_version="1.36.1_1530").start()
    yield emulator
    emulator.stop()


def test_the_canary_brings_its_new_worker_to_ready_before_its_batch_mates_in_the_pool_and_zone_are_replaced(emu):
    olds = [emu.add_worker()["id"] for _ in range(3)]
    emu.replace_lag = 20  # without the canary every request would be in before any new worker shows
    results = replace_together(emu, olds)
    assert all(isinstance(r, dict) for r in results.values()), results
    (first_at, canary), *later = emu.replace_log
    canary_new = results[canary]["new_worker_id"]
    ready_at = emu.deployed_at[canary_new]
    assert len(later) == 2 and all(at > ready_at for at, _ in later), (emu.replace_log, ready_at)
    assert {results[old]["new_worker_id"] for old in olds} == {w["id"] for w in live_workers(emu)}


def test_a_stock_out_costs_the_canary_alone_and_other_pools_go_on(emu):
    """The GPU flavor runs out in pool gpu, zone us-south-1: its new workers end in provision_failed. Exactly one
    replaceWorker goes there; its batch-mates keep their old workers and name the canary's state and IBM's message;
    pool gpu-b is replaced."""
    olds = [emu.add_worker()["id"] for _ in range(3)]
    other = emu.add_worker(pool_name="gpu-b")["id"]
    emu.fail_new_workers = ("provision_failed", "Insufficient capacity for flavor gx3.16x80.l4 in zone us-south-1")
    emu.fail_new_workers_in = {("gpu", "us-south-1")}
    results = replace_together(emu, [*olds, other])
    (canary,) = set(emu.replaced) & set(olds)
    assert sorted(emu.replaced) == sorted([canary, other]), emu.replace_log
    assert isinstance(results[canary], ReplacementError) and "provision_failed" in str(results[canary])
    for mate in set(olds) - {canary}:
        text = str(results[mate])
        assert isinstance(results[mate], ReplacementError), results
        assert f"worker {mate} of cluster gpu-cluster was not replaced" in text
        assert "provision_failed" in text and "Insufficient capacity for flavor gx3.16x80.l4" in text, text
        assert f"worker {canary}:" in text, text
        assert emu.workers[mate]["lifecycle"]["actualState"] == "deployed"
    assert isinstance(results[other], dict), results


def test_a_proven_pool_and_zone_lets_later_replacements_go_at_once_unless_every_batch_proves_it(emu):
    """Once a replacement of this run reached Ready in a pool and zone, later ones there need not wait again (both
    requests go before either new worker shows); with workerPoolRules.canary everyBatch each batch proves it anew."""
    first, *pair = [emu.add_worker()["id"] for _ in range(3)]
    assert isinstance(replace(emu, first), dict)
    emu.replace_lag = 60  # a new worker shows long after both mates' requests
    before = len(emu.replace_log)
    results = replace_together(emu, pair)
    assert all(isinstance(r, dict) for r in results.values()), results
    (_, a), (_, b) = emu.replace_log[before:]
    new_a = results[a]["new_worker_id"]
    assert emu.replace_log[before + 1][0] < emu.first_listed[new_a], emu.replace_log  # b did not wait for a



def test_with_every_batch_each_batch_proves_its_pool_and_zone_again(emu, monkeypatch):
    """workerPoolRules.canary everyBatch: each batch's first replacement in a pool and zone is its canary; once it
    is Ready, the rest of that batch there goes together, and the next batch has a canary of its own."""
    drains_recorded(monkeypatch)
    every = {"pool_rules": {"canary": "everyBatch"}}
    emu.replace_lag = 60  # a new worker shows long after both mates' requests
    for index, size in ((1, 3), (2, 2)):
        olds = [emu.add_worker(pool_name="gpu-c")["id"] for _ in range(size)]
        before = len(emu.replace_log)
        results = replace_together(emu, olds, evict={"kubeconfig": None, "budget": {"index": index}}, **every)
        assert all(isinstance(r, dict) for r in results.values()), results
        (_, canary), *mates = emu.replace_log[before:]
        ready_at = emu.deployed_at[results[canary]["new_worker_id"]]
        assert len(mates) == size - 1 and all(at > ready_at for at, _ in mates), (emu.replace_log, index)
        if len(mates) > 1:  # the batch-mates went together, not one canary after the other
            (_, first), (second_at, _) = mates
            assert second_at < emu.first_listed[results[first]["new_worker_id"]], emu.replace_log


def test_a_failure_after_the_pool_was_proven_stops_every_later_request_there(emu):
    """A stock-out after the canary proved the pool and zone costs the replacements then in flight; none goes
    there after it in this run."""
    first, second, third = [emu.add_worker()["id"] for _ in range(3)]
    assert isinstance(replace(emu, first), dict)
    emu.fail_new_workers = ("provision_failed", "Insufficient capacity")
    with pytest.raises(ReplacementError, match="provision_failed"):
        replace(emu, second)
    before = len(emu.replace_log)
    with pytest.raises(ReplacementError, match=f"worker {second}: .*provision_failed") as refused:
        replace(emu, third)
    assert len(emu.replace_log) == before and "no further replaceWorker goes there" in str(refused.value)
    assert emu.workers[third]["lifecycle"]["actualState"] == "deployed"


def test_other_pools_and_zones_have_their_own_canary(emu):
    same = [emu.add_worker(pool_name="gpu-a")["id"], emu.add_worker(pool_name="gpu-a")["id"]]
    elsewhere = [emu.add_worker(pool_name="gpu-b")["id"], emu.add_worker(pool_name="gpu-a", zone="us-south-2")["id"]]
    emu.replace_lag = 10 ** 6  # no new worker ever shows
    results = replace_together(emu, [*same, *elsewhere], timeout=1)
    # One canary per pool and zone was requested; its batch-mate in gpu-a/us-south-1 waited for it and stopped with
    # it (or timed out waiting), never requested.
    (canary,) = set(same) & set(emu.replaced)
    (waiter,) = set(same) - {canary}
    assert sorted(emu.replaced) == sorted([canary, *elsewhere])
    assert all(isinstance(results[old], WaitTimeout) for old in [canary, *elsewhere]), results
    assert "in worker pool gpu-a, zone us-south-1 a replacement of this run stopped" in str(results[waiter])


def test_a_canary_that_shows_no_new_worker_stops_its_batch_mates_unreplaced(emu):
    olds = [emu.add_worker()["id"], emu.add_worker()["id"]]
    emu.rebalance = False  # the pool says rebalancing is on, yet no worker comes back
    results = replace_together(emu, olds, rebalance_timeout=0.2)
    (_, canary), = emu.replace_log
    (mate,) = set(olds) - {canary}
    assert "no new worker appeared" in str(results[canary])
    assert isinstance(results[mate], ReplacementError)
    assert "in worker pool gpu, zone us-south-1 a replacement of this run stopped after IKS accepted it" \
           in str(results[mate]) and f"worker {canary}: " in str(results[mate])
    assert emu.workers[mate]["lifecycle"]["actualState"] == "deployed"


def drains_recorded(monkeypatch, seconds: float = 0.0) -> tuple[list[tuple[str, float, float]], list[str]]:
    """The drain and its undo, as the replacement calls them (kube/eviction.py), recorded: (node, start, end) per
    drain taking `seconds`, and each node released. No budget, no autoscaler ConfigMap."""
    from iks_gpu_migration.iks import pool_rules, replacement
    from iks_gpu_migration.kube import eviction
    drains, released, lock = [], [], threading.Lock()

    def drain(node, evict):
        start = time.monotonic()
        time.sleep(seconds)
        with lock:
            drains.append((node, start, time.monotonic()))
        return {"evicted": []}
    monkeypatch.setattr(eviction, "drain", drain)
    monkeypatch.setattr(eviction, "release", lambda node, evict: released.append(node) or True)
    monkeypatch.setattr(replacement, "hold_for_budget", lambda node, evict: None)
    monkeypatch.setattr(pool_rules, "autoscaler_pools", lambda props: frozenset())
    return drains, released


def test_a_batch_drains_beside_its_canary_and_only_its_requests_wait_for_it(emu, monkeypatch):
    """One drain per batch, not the canary's and then its batch-mates': every node of the pool and zone drains at
    once (the budget admitted them all), and only the batch-mates' replaceWorker requests wait for the canary's new
    worker."""
    drains, released = drains_recorded(monkeypatch, seconds=0.5)
    olds = [emu.add_worker()["id"] for _ in range(3)]
    emu.replace_lag = 20
    results = replace_together(emu, olds, evict={"kubeconfig": None})
    assert all(isinstance(r, dict) for r in results.values()), results
    assert len(drains) == 3 and max(s for _, s, _ in drains) < min(e for _, _, e in drains), drains
    (_, canary), *later = emu.replace_log
    ready_at = emu.deployed_at[results[canary]["new_worker_id"]]
    assert len(later) == 2 and all(at > ready_at for at, _ in later), (emu.replace_log, ready_at)
    assert not released


def test_a_canary_that_stops_uncordons_its_drained_batch_mates(emu, monkeypatch):
    _, released = drains_recorded(monkeypatch)
    olds = [emu.add_worker()["id"], emu.add_worker()["id"]]
    nodes = {w: emu.workers[w]["networkInterfaces"][0]["ipAddress"] for w in olds}
    emu.rebalance = False  # the pool says rebalancing is on, yet no worker comes back
    results = replace_together(emu, olds, rebalance_timeout=0.2, evict={"kubeconfig": None})
    (_, canary), = emu.replace_log
    (mate,) = set(olds) - {canary}
    assert isinstance(results[mate], ReplacementError), results
    assert "its node, if drained, is uncordoned again" in str(results[mate])
    # The canary's replace was requested: its node stays out. The batch-mate's drain is undone.
    assert released == [nodes[mate]], (released, nodes)
    assert emu.workers[mate]["lifecycle"]["actualState"] == "deployed"


def test_the_stack_config_opt_outs_reach_every_replacement():
    import copy
    from harness import run_program, stack_config
    raw = copy.deepcopy(stack_config("pilot"))
    raw["workerPoolRules"] = {"allowRebalancingOff": ["gpu-a"], "allowAutoscaling": ["gpu-b"]}
    run = run_program(raw)
    replacements = run.of_type("pulumi-python:dynamic/gpu-migration:WorkerReplacement")
    assert replacements and all(r.inputs["pool_rules"] == {"allow_rebalancing_off": ["gpu-a"],
                                                           "allow_autoscaling": ["gpu-b"]} for r in replacements)
    # Every replacement comes after the master, whose create refuses a master above the target (before any drain).
    assert all(run.depends(r.name, "master-version") for r in replacements)


def test_a_canary_stopped_before_its_request_frees_its_pool_and_zone_for_the_next(emu, monkeypatch):
    """A canary whose drain is refused (a bare pod on its node) says nothing about the pool rebuilding workers: its
    batch-mate becomes the canary and is replaced."""
    from iks_gpu_migration.iks import pool_rules, replacement
    from iks_gpu_migration.kube import eviction
    olds = [emu.add_worker()["id"] for _ in range(2)]
    drained, lock = [], threading.Lock()

    def drain(node, evict):
        with lock:
            drained.append(node)
            if len(drained) == 1:
                raise eviction.EvictionError(f"node {node} cannot be drained without losing data")
        return {"evicted": []}
    monkeypatch.setattr(eviction, "drain", drain)
    monkeypatch.setattr(eviction, "release", lambda node, evict: False)
    monkeypatch.setattr(replacement, "hold_for_budget", lambda node, evict: None)
    monkeypatch.setattr(pool_rules, "autoscaler_pools", lambda props: frozenset())
    results = replace_together(emu, olds, evict={"kubeconfig": None})
    refused = [old for old, r in results.items() if isinstance(r, eviction.EvictionError)]
    assert len(refused) == 1 and len(drained) == 2, results
    (mate,) = set(olds) - set(refused)
    assert isinstance(results[mate], dict) and [old for _, old in emu.replace_log] == [mate]


def test_a_batch_mate_goes_as_soon_as_the_canary_is_done_not_a_poll_interval_later():
    """The canary's news is this process's own: its batch-mates wake on it (Canaries notifies), so a production
    pollInterval (15 s) is not added to every batch."""
    from iks_gpu_migration.iks import pool_rules
    canaries = pool_rules.Canaries()
    props = {"cluster": "gpu-cluster", "timeout": 60, "poll_interval": 30}
    canary, mate = ({"id": w, "poolID": "gpu", "poolName": "gpu", "location": "us-south-1"} for w in ("w1", "w2"))
    canaries.wait_turn(props, canary)  # the first of its pool and zone: the canary, not held
    went: list[float] = []
    waiter = threading.Thread(target=lambda: (canaries.wait_turn(props, mate), went.append(time.monotonic())))
    waiter.start()
    time.sleep(0.3)
    assert not went  # held while the canary shows nothing
    shown = time.monotonic()
    canaries.end("gpu-cluster", "gpu-cluster/w1", None, worker=canary)
    waiter.join(5)
    assert went and went[0] - shown < 1.0, went


