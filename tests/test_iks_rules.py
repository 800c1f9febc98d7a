"""Issue 17, points 2 and 3: IKS's version rules (n-2 across every pool, major.minor to the master, a master above the
target stops `up` early) and pool rules (rebalancing on, no autoscaler, one canary per pool and zone), decided by
plan/iks_rules.py and enforced by the providers against the emulator, which knows the same rules."""
import threading
import time

import pytest

from iks_gpu_migration.iks.api import IksApiError, IksClient
from iks_gpu_migration.iks.master import MasterVersionProvider
from iks_gpu_migration.iks.provider import ReplacementError
from iks_gpu_migration.common.waiting import WaitTimeout
from iks_gpu_migration.plan import iks_rules
from tests.emulators.iks import IksEmulator
from tests.test_iks_providers import live_workers, master_props, replace, replace_together

REPLACE = ("POST", "/v2/vpc/replaceWorker")
PUT = ("PUT", "/v1/clusters/gpu-cluster")


@pytest.fixture
def emu():
    emulator = IksEmulator(master_version="1.36.1_1530").start()
    yield emulator
    emulator.stop()


@pytest.fixture
def old_master():
    emulator = IksEmulator(master_version="1.35.4_1540").start()
    yield emulator
    emulator.stop()


# Pure rules -------------------------------------------------------------------------------------------------------

def test_the_master_is_sent_major_minor_only():
    assert iks_rules.master_version("1.37.0_1501") == "1.37" == iks_rules.master_version("1.37")
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        iks_rules.master_version("latest")


def test_skew_allows_two_minors_behind_and_names_every_pool_further_behind():
    pools = {"default": "1.35.4_1540", "gpu": "1.35.4_1541", "edge": "1.34.9_1600"}
    assert iks_rules.skew_refusal("c", "1.35.4_1540", ["1.36", "1.37"], {"default": "1.35.4_1540"}) is None
    assert iks_rules.skew_refusal("c", "1.35.4_1540", [], pools) is None  # no step, nothing to refuse
    message = iks_rules.skew_refusal("c", "1.35.4_1540", ["1.36", "1.37"], pools)
    assert "worker pool(s) edge at 1.34.9_1600 more than 2 behind" in message
    assert "default at" not in message and "gpu at" not in message
    assert "kubeVersion to at most 1.36" in message and "ibmcloud ks worker replace" in message
    assert "--force-update" in message and "Nothing was updated" in message


def test_lowest_version_per_pool():
    assert iks_rules.lowest_by_pool([("a", "1.36.1_1530"), ("a", "1.35.4_1540"), ("b", "1.37.0_1501"),
                                     ("b", "")]) == {"a": "1.35.4_1540", "b": "1.37.0_1501"}


def test_master_above_target_minor_is_refused_fix_packs_are_not_compared():
    assert iks_rules.master_above_target("c", "1.37.0_1501", "1.37.0_1400") is None
    assert iks_rules.master_above_target("c", "1.36.1_1530", "1.37") is None
    message = iks_rules.master_above_target("c", "1.38.0_1500", "1.37.0_1501")
    assert "above kubeVersion 1.37.0_1501" in message and "kubeVersion to 1.38" in message
    assert "Nothing was drained or replaced" in message


def test_pool_rules_and_their_opt_outs():
    pool = {"id": "gpu-1", "poolName": "gpu", "autoscaleEnabled": False,
            "zones": [{"id": "z1", "autobalanceEnabled": False}, {"id": "z2", "autobalanceEnabled": True}]}
    none = iks_rules.PoolRules()
    assert "ibmcloud ks worker-pool rebalance --cluster c --worker-pool gpu" in \
        iks_rules.pool_refusal("c", "w1", pool, "z1", none)
    assert iks_rules.pool_refusal("c", "w1", pool, "z2", none) is None
    assert iks_rules.pool_refusal("c", "w1", pool, "z1", iks_rules.PoolRules.from_props(
        {"allow_rebalancing_off": ["gpu"]})) is None
    scaled = {**pool, "autoscaleEnabled": True}
    assert "iks-ca-configmap" in iks_rules.pool_refusal("c", "w1", scaled, "z2", none)
    assert iks_rules.pool_refusal("c", "w1", scaled, "z2", iks_rules.PoolRules(allow_autoscaling=frozenset({"gpu"}))) \
        is None
    # The autoscaler's ConfigMap counts too (by pool name or ID).
    assert "autoscaler manages worker pool gpu" in iks_rules.pool_refusal("c", "w1", pool, "z2", none, frozenset({"gpu"}))


def test_autoscaled_pools_from_the_configmap():
    assert iks_rules.autoscaled_pools('[{"name": "default", "minSize": 1, "maxSize": 2, "enabled": false}, '
                                      '{"name": "gpu", "minSize": 2, "maxSize": 5, "enabled": true}]') == {"gpu"}
    assert iks_rules.autoscaled_pools(None) == frozenset() == iks_rules.autoscaled_pools("not json")


# The emulator knows the rules -------------------------------------------------------------------------------------

def test_emulator_refuses_a_master_update_leaving_a_pool_more_than_two_minors_behind_unless_forced(emu):
    emu.add_worker(pool_name="edge", version="1.34.9_1600")
    client = IksClient.from_api(emu.api())
    with pytest.raises(IksApiError, match=r"HTTP 400: .*edge would be more than two minor versions behind"):
        client.update_master("gpu-cluster", "1.37")
    client._call("force", "PUT", "/v1/clusters/gpu-cluster", body={"action": "update", "version": "1.37", "force": True})
    assert emu.cluster["lifecycle"]["masterState"] == "updating"


def test_emulator_refuses_a_fix_pack_for_the_master(emu):
    with pytest.raises(IksApiError, match=r"1\.37\.0_1501 is not valid: specify major\.minor"):
        IksClient.from_api(emu.api()).update_master("gpu-cluster", "1.37.0_1501")
    assert emu.cluster["lifecycle"]["masterState"] == "deployed"


@pytest.mark.parametrize("rule", ["rebalancing off", "autoscaled"])
def test_emulator_replace_in_a_pool_that_does_not_rebalance_creates_no_worker(emu, rule):
    old = emu.add_worker()["id"]
    emu.set_autobalance("gpu") if rule == "rebalancing off" else emu.autoscale("gpu")
    IksClient.from_api(emu.api()).replace_worker("gpu-cluster", old)
    for _ in range(4):
        emu.tick()
    assert emu.workers[old]["lifecycle"]["actualState"] == "deleted" and live_workers(emu) == []


# Version rules in the providers -------------------------------------------------------------------------------

def test_a_master_step_leaving_a_pool_more_than_two_minors_behind_is_refused_naming_the_pools(old_master):
    old_master.add_worker(pool_name="default", version="1.35.4_1540")
    old_master.add_worker(pool_name="edge", version="1.34.9_1600")
    old_master.add_worker(pool_name="gpu", version="1.35.4_1540")
    old_master.versions["1.38"] = "1.38.0_1500"
    with pytest.raises(IksApiError, match=r"from 1\.35\.4_1540 to 1\.38 would leave worker pool\(s\) "
                                          r"default at 1\.35\.4_1540, edge at 1\.34\.9_1600, gpu at 1\.35\.4_1540 "
                                          r"more than 2 behind.*at most 1\.36.*Nothing was updated"):
        MasterVersionProvider().create(master_props(old_master, "1.38"))
    assert old_master.count(*PUT) == 0  # refused before the first step (1.36 alone would have been fine)


def test_a_fix_pack_target_sends_major_minor_to_the_master(emu):
    result = MasterVersionProvider().create(master_props(emu, "1.37.0_1501"))
    assert result.outs["actual_version"] == "1.37.0_1501"
    assert emu.master_requests == [{"action": "update", "version": "1.37"}]


def test_a_master_above_the_target_stops_before_any_drain_or_replace():
    emu = IksEmulator(master_version="1.37.0_1501").start()
    try:
        old = emu.add_worker(version="1.35.4_1540")["id"]
        with pytest.raises(IksApiError, match=r"master of cluster gpu-cluster is at 1\.37\.0_1501, above kubeVersion "
                                              r"1\.36.*Set gpu-migration:kubeVersion to 1\.37"):
            MasterVersionProvider().create(master_props(emu, "1.36"))
        # A replacement reached without the master resource (e.g. a node added later) stops as early: the gate runs
        # before the drain (`evict` would name a kubeconfig nobody reads).
        with pytest.raises(ReplacementError, match=r"above kubeVersion 1\.36.*Nothing was drained or replaced"):
            replace(emu, old, evict={"kubeconfig": "/nonexistent"})
        assert emu.count(*REPLACE) == 0 and emu.count(*PUT) == 0
        assert emu.workers[old]["lifecycle"]["actualState"] == "deployed"
    finally:
        emu.stop()


# Pool rules in the providers ----------------------------------------------------------------------------------

def test_a_pool_with_rebalancing_off_is_refused_before_any_replace(emu):
    old = emu.add_worker()["id"]
    emu.set_autobalance("gpu")
    with pytest.raises(ReplacementError, match=rf"worker {old} of cluster gpu-cluster was not replaced \(nothing was "
                                               r"drained\): automatic rebalancing is off for worker pool gpu in zone "
                                               r"us-south-1.*ibmcloud ks worker-pool rebalance --cluster gpu-cluster "
                                               r"--worker-pool gpu.*allowRebalancingOff"):
        replace(emu, old)
    assert emu.count(*REPLACE) == 0


def test_an_autoscaled_pool_is_refused_before_any_replace(emu):
    old = emu.add_worker()["id"]
    emu.autoscale("gpu")
    with pytest.raises(ReplacementError, match=r"cluster autoscaler manages worker pool gpu.*iks-ca-configmap.*"
                                               r"workerPoolRules\.allowAutoscaling"):
        replace(emu, old)
    assert emu.count(*REPLACE) == 0


def test_a_pool_the_autoscaler_configmap_enables_is_refused(emu, kube):
    kube.core.create_namespaced_config_map("kube-system", {
        "metadata": {"name": "iks-ca-configmap"},
        "data": {"workerPoolsConfig.json": '[{"name": "gpu", "minSize": 1, "maxSize": 3, "enabled": true}]'}})
    try:
        old = emu.add_worker()["id"]
        with pytest.raises(ReplacementError, match=r"cluster autoscaler manages worker pool gpu"):
            replace(emu, old, evict={"kubeconfig": kube.kubeconfig, "timeout": 5, "poll_interval": 0.01})
        assert emu.count(*REPLACE) == 0
    finally:
        kube.core.delete_namespaced_config_map("iks-ca-configmap", "kube-system")


def test_the_opt_out_lets_the_pool_pass(emu):
    old = emu.add_worker()["id"]
    emu.set_autobalance("gpu")
    with pytest.raises(ReplacementError, match="no new worker appeared"):  # replaced; nobody added the new worker
        replace(emu, old, pool_rules={"allow_rebalancing_off": ["gpu"]}, rebalance_timeout=0.1)
    assert emu.count(*REPLACE) == 1
    other = emu.add_worker(pool_name="scaled")["id"]
    emu.autoscale("scaled")
    with pytest.raises(ReplacementError, match="no new worker appeared"):
        replace(emu, other, pool_rules={"allow_autoscaling": ["scaled"]}, rebalance_timeout=0.1)
    assert emu.count(*REPLACE) == 2


# Canary per pool and zone ---------------------------------------------------------------------------------------

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


# The master before each replacement ----------------------------------------------------------------------------

def test_once_the_master_was_seen_resting_the_check_before_a_replacement_takes_one_reading(emu):
    from iks_gpu_migration.iks.master import wait_master_at
    client, props = IksClient.from_api(emu.api()), {"timeout": 5, "poll_interval": 0.01}
    readings = lambda: emu.count("GET", "/v2/vpc/getCluster")  # noqa: E731
    before = readings()
    wait_master_at(client, "gpu-cluster", "1.36", props)
    assert readings() - before == 3  # three resting readings in a row, the first time in this process
    before = readings()
    wait_master_at(client, "gpu-cluster", "1.36", props)
    assert readings() - before == 1  # a master operation started since would show on it
    emu.busy_master(ticks=3)  # ... as this one does: three readings in a row once more
    before = readings()
    wait_master_at(client, "gpu-cluster", "1.36", props)
    assert readings() - before >= 4
    before = readings()
    wait_master_at(client, "gpu-cluster", "1.36", props)
    assert readings() - before == 1


def test_the_master_version_resource_counts_as_seeing_the_master_rest(emu):
    from iks_gpu_migration.iks.master import wait_master_at
    MasterVersionProvider().create(master_props(emu, "1.36"))
    before = emu.count("GET", "/v2/vpc/getCluster")
    wait_master_at(IksClient.from_api(emu.api()), "gpu-cluster", "1.36", {"timeout": 5, "poll_interval": 0.01})
    assert emu.count("GET", "/v2/vpc/getCluster") - before == 1


def test_a_canary_still_provisioning_past_its_timeout_stops_its_batch_mates_unrequested(emu):
    """The canary's new worker stays in provisioning: when the canary times out, its batch-mates stop at once without
    a request of their own (not after their own, longer wait), naming the canary and the state it was left in."""
    from iks_gpu_migration.iks import master
    master.RESTED.add(("gpu-cluster", "1.36"))  # seen resting (MasterVersion): one reading before each replacement
    olds = [emu.add_worker()["id"] for _ in range(2)]
    emu.stick_new_workers = True  # provisioning forever
    started = time.monotonic()
    results = replace_together(emu, olds, timeout=2, poll_interval=0.5)
    (_, canary), = emu.replace_log
    (mate,) = set(olds) - {canary}
    assert isinstance(results[canary], WaitTimeout) and "provisioning" in str(results[canary]), results
    assert isinstance(results[mate], ReplacementError) and f"worker {canary}: timed out" in str(results[mate])
    assert time.monotonic() - started < 5, results
    assert emu.workers[mate]["lifecycle"]["actualState"] == "deployed"
