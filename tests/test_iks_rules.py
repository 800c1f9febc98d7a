"""Issue 17, points 2 and 3: IKS's version rules (n-2 across every pool, major.minor to the master, a master above the
target stops `up` early) and pool rules (rebalancing on, no autoscaler; the canary per pool and zone is
test_canary.py's), decided by plan/iks_rules.py and enforced by the providers against the emulator, which knows the
same rules."""
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
