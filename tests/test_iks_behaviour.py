"""Issue 10: the IKS providers against the emulator behaving as IKS really does (fix packs, version bumps, deleted
pools, failed workers, master states, unknown clusters, rebalancing off, retries, flapping health)."""
import socket

import pytest


from iks_gpu_migration.iks.api import ClusterNotFound, IksApiError, IksClient
from iks_gpu_migration.common.waiting import WaitTimeout
from tests.emulators.iks import IksEmulator
from tests.test_iks_providers import live_workers, master_props, pool_props, replace, replacement_props
from iks_gpu_migration.iks.master import MasterVersionProvider
from iks_gpu_migration.iks.pool import TempGpuPoolProvider
from iks_gpu_migration.iks.provider import ReplacementError
from iks_gpu_migration.iks.replacement import WorkerReplacementProvider

REPLACE = ("POST", "/v2/vpc/replaceWorker")
PUT = ("PUT", "/v1/clusters/gpu-cluster")


@pytest.fixture
def emu(monkeypatch):
    monkeypatch.setenv("IC_API_KEY", "test-api-key")  # delete() reads the key from config/env, never from outputs
    emulator = IksEmulator(master_version="1.36.1_1530").start()
    yield emulator
    emulator.stop()


def new_emulator(master: str) -> IksEmulator:
    return IksEmulator(master_version=master).start()


# 1. Worker fix packs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("worker_fix_pack", ["1.36.1_1529", "1.36.1_1531", "1.36.2_1500"])
def test_a_pinned_kube_version_with_another_worker_fix_pack_replaces_once(emu, worker_fix_pack):
    emu.worker_versions["1.36"] = worker_fix_pack  # newer or older than the master's 1.36.1_1530
    old = emu.add_worker()["id"]
    outs = replace(emu, old, kube_version="1.36.1_1530")
    assert emu.count(*REPLACE) == 1
    assert outs["new_worker_id"] != old and outs["actual_version"] == worker_fix_pack
    assert len(live_workers(emu)) == 1


def test_major_minor_target_accepts_any_worker_fix_pack(emu):
    emu.worker_versions["1.36"] = "1.36.0_1499"  # older than the master's build
    worker = emu.add_worker(version="1.36.0_1499")
    assert replace(emu, worker["id"])["new_worker_id"] == worker["id"]
    assert emu.count(*REPLACE) == 0


def test_a_resumed_replacement_never_replaces_the_worker_it_created(emu):
    emu.worker_versions["1.36"] = "1.36.1_1529"
    old = emu.add_worker()["id"]
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout):
        replace(emu, old, kube_version="1.36.1_1530", timeout=0.2)
    emu.stuck.clear()
    outs = replace(emu, old, kube_version="1.36.1_1530")  # the next `up`: follows to the new worker, stops there
    assert emu.count(*REPLACE) == 1 and outs["actual_version"] == "1.36.1_1529"


# 2. kubeVersion bump with nodes already migrated ----------------------------------------------------------------

def test_kube_version_bump_replaces_the_current_worker_from_state_once(emu):
    configured = emu.add_worker()["id"]
    olds = replace(emu, configured)  # 1.36, recorded in state
    MasterVersionProvider().create(master_props(emu, "1.37"))
    provider = WorkerReplacementProvider()
    news = replacement_props(emu, configured, kube_version="1.37")  # the config still names the first worker
    assert provider.diff(configured, olds, news).replaces == []
    outs = provider.update(configured, olds, news).outs
    assert emu.count(*REPLACE) == 2  # once per step
    assert outs["old_worker_id"] == olds["new_worker_id"] and outs["new_worker_id"] not in (configured, olds["new_worker_id"])
    assert outs["actual_version"].startswith("1.37.") and len(live_workers(emu)) == 1


def test_interrupted_bump_resumes_from_state_without_a_second_replace(emu):
    olds = replace(emu, emu.add_worker()["id"])
    MasterVersionProvider().create(master_props(emu, "1.37"))
    provider = WorkerReplacementProvider()
    news = replacement_props(emu, olds["old_worker_id"], kube_version="1.37")
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout, match="resumes"):
        provider.update("id", olds, {**news, "timeout": 0.2})
    emu.stuck.clear()
    outs = provider.update("id", olds, news).outs  # a failed update keeps the old state: the same olds again
    assert emu.count(*REPLACE) == 2 and outs["actual_version"].startswith("1.37.")


def test_bump_is_refused_while_the_master_is_below_the_target(emu):
    olds = replace(emu, emu.add_worker()["id"])
    with pytest.raises(ReplacementError, match=r"master of cluster gpu-cluster is at 1\.36\.1_1530, below "
                                                   r"kubeVersion 1\.37.*Nothing was replaced"):
        WorkerReplacementProvider().update("id", olds, replacement_props(emu, "x", kube_version="1.37"))
    assert emu.count(*REPLACE) == 1


# 3. Deleted things stay readable ----------------------------------------------------------------------------------

def test_removed_pool_and_its_workers_stay_readable_as_deleted(emu):
    provider = TempGpuPoolProvider()
    created = provider.create(pool_props(emu))
    provider.delete(created.id, created.outs)
    client = IksClient.from_api(emu.api())
    pool = client.get_worker_pool("gpu-cluster", created.id)
    assert pool["lifecycle"]["actualState"] == "deleted" and pool["zones"] == []
    shown = {w["id"]: w for w in client.list_workers("gpu-cluster", show_deleted=True)}
    assert all(shown[w]["health"]["state"] == "deleted" for w in created.outs["worker_ids"])
    assert not client.list_workers("gpu-cluster")


def test_pool_removal_waits_for_the_pool_and_its_workers(emu):
    provider = TempGpuPoolProvider()
    created = provider.create(pool_props(emu))
    emu.steps = 6  # workers take longer to delete than the pool request
    provider.delete(created.id, created.outs)
    assert all(emu.workers[w]["lifecycle"]["actualState"] == "deleted" for w in created.outs["worker_ids"])
    assert emu.pools[created.id]["lifecycle"]["actualState"] == "deleted"


def test_a_deleted_pool_is_never_adopted(emu):
    provider = TempGpuPoolProvider()
    first = provider.create(pool_props(emu))
    provider.delete(first.id, first.outs)
    second = provider.create(pool_props(emu))
    assert emu.count("POST", "/v2/vpc/createWorkerPool") == 2 and second.id != first.id
    assert not set(second.outs["worker_ids"]) & set(first.outs["worker_ids"])


def test_a_pool_being_deleted_is_waited_for_then_created_again(emu):
    provider = TempGpuPoolProvider()
    first = provider.create(pool_props(emu))
    IksClient.from_api(emu.api()).remove_worker_pool("gpu-cluster", "gpu-migration-temp")  # someone removes it
    second = provider.create(pool_props(emu))
    assert emu.pools[first.id]["lifecycle"]["actualState"] == "deleted"
    assert second.id != first.id and emu.count("POST", "/v2/vpc/createWorkerPool") == 2


# 4. Failure states -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ["provision_failed", "deploy_failed"])
def test_a_failed_replacement_stops_at_once_with_iks_message(emu, state):
    old = emu.add_worker()["id"]
    emu.fail_new_workers = (state, "Insufficient capacity for flavor gx3.16x80.l4 in zone us-south-1.")
    with pytest.raises(ReplacementError) as raised:
        replace(emu, old, timeout=60)
    message = str(raised.value)
    assert state in message and "Insufficient capacity" in message and "ibmcloud ks worker replace" in message
    assert emu.count(*REPLACE) == 1


def test_a_failed_sibling_is_never_taken_for_the_replacement(emu):
    old = emu.add_worker()["id"]
    failed = emu.add_worker(state="provisioning", grow=False)["id"]
    emu.workers[failed]["lifecycle"].update(actualState="provision_failed", message="quota")
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout):
        replace(emu, old, timeout=0.2)
    emu.stuck.clear()
    outs = replace(emu, old)  # resume: the failed sibling is not a candidate
    assert outs["new_worker_id"] not in (old, failed) and emu.count(*REPLACE) == 1


def test_a_failed_temp_pool_worker_stops_at_once(emu):
    emu.fail_new_workers = ("provision_failed", "The subnet has no free IP addresses.")
    with pytest.raises(IksApiError, match=r"temporary pool gpu-migration-temp is provision_failed.*no free IP"):
        TempGpuPoolProvider().create(pool_props(emu, timeout=60))


# 5. Master states --------------------------------------------------------------------------------------------------

def test_master_reads_updating_while_it_updates():
    emu = new_emulator("1.35.4_1540")
    try:
        IksClient.from_api(emu.api()).update_master("gpu-cluster", "1.36")
        assert emu.cluster["lifecycle"]["masterState"] == "updating"
    finally:
        emu.stop()


def test_a_failed_master_update_is_requested_again():
    emu = new_emulator("1.35.4_1540")
    emu.fail_master_update = True
    try:
        outs = MasterVersionProvider().create(master_props(emu)).outs
        assert outs["actual_version"] == "1.36.1_1530" and emu.count(*PUT) == 2
    finally:
        emu.stop()


def test_target_version_newer_at_rest_is_not_an_update_in_progress():
    emu = new_emulator("1.35.4_1540")
    emu.cluster["targetVersion"] = "1.36.1_1530"  # left over by a failed update; the master rests deployed
    try:
        assert MasterVersionProvider().create(master_props(emu)).outs["actual_version"] == "1.36.1_1530"
        assert emu.count(*PUT) == 1
    finally:
        emu.stop()


def test_master_that_keeps_failing_stops_with_a_clear_error():
    emu = new_emulator("1.35.4_1540")
    try:
        emu.fail_master_update = True
        original = emu._update_master

        def always_failing(body):
            emu.fail_master_update = True
            return original(body)
        emu._update_master = always_failing
        with pytest.raises(IksApiError, match=r"requested 3 times and the master fell back to 1\.35\.4_1540"):
            MasterVersionProvider().create(master_props(emu))
        assert emu.count(*PUT) == 3
    finally:
        emu.stop()


def test_busy_master_is_waited_for_and_ef9cc_retried():
    emu = new_emulator("1.35.4_1540")
    try:
        emu.busy_master(6)  # e.g. a VPN configuration update: no PUT while masterStatus is not Ready
        emu.busy_on_update = 1  # and a CA rotation starts just before our PUT: 400 Ef9cc
        outs = MasterVersionProvider().create(master_props(emu)).outs
        assert outs["actual_version"] == "1.36.1_1530" and emu.count(*PUT) == 2
    finally:
        emu.stop()


def test_ef9cc_is_what_the_emulator_answers_while_the_master_is_busy():
    emu = new_emulator("1.35.4_1540")
    try:
        emu.busy_master(50)
        with pytest.raises(IksApiError) as raised:
            IksClient.from_api(emu.api()).update_master("gpu-cluster", "1.36")
        assert raised.value.status_code == 400 and raised.value.code == "Ef9cc"
    finally:
        emu.stop()


# 6. Cluster not found ------------------------------------------------------------------------------------------

def test_unknown_cluster_names_it_and_hints_account_and_resource_group(emu):
    with pytest.raises(ClusterNotFound, match=r"cluster gpu-clustr was not found.*G0004.*account and resource group"):
        replace(emu, "w1", cluster="gpu-clustr")
    with pytest.raises(ClusterNotFound):  # not mistaken for "the pool is gone"
        TempGpuPoolProvider().delete("p", pool_props(emu, cluster="gpu-clustr"))


# 7. Rebalancing off ----------------------------------------------------------------------------------------------

def test_rebalancing_off_is_detected_and_explained(emu):
    old = emu.add_worker()["id"]
    emu.rebalance = False
    with pytest.raises(ReplacementError, match=rf"worker {old} .* deleted and no new worker appeared in its pool "
                                                   r"gpu .*rebalancing.*ibmcloud ks worker-pool rebalance"):
        replace(emu, old, timeout=60, rebalance_timeout=0.1)
    assert emu.count(*REPLACE) == 1


# 8. Retries ------------------------------------------------------------------------------------------------------

def test_a_retried_create_pool_adopts_its_own_pool(emu):
    emu.answer_after_done(1, 503, path="/v2/vpc/createWorkerPool")  # created, but the answer is lost
    result = TempGpuPoolProvider().create(pool_props(emu))
    assert emu.count("POST", "/v2/vpc/createWorkerPool") == 2  # the SDK's retry met "already exists"
    assert len(emu.pools) == 1 and result.id in emu.pools


def test_iam_5xx_is_retried(emu):
    emu.add_worker(version="1.36.1_1530", worker_id="w1")
    emu.fail_next(2, 503, path="/identity/token")
    assert replace(emu, "w1")["new_worker_id"] == "w1"


def test_iam_outage_is_reported_as_iam_trouble_not_a_bad_key(emu):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(IksApiError) as raised:
        replace(emu, "w1", api={**emu.api(), "iam_endpoint": dead})
    message = str(raised.value)
    assert "IAM" in message and "unavailable" in message and "not a bad API key" in message
    assert "check the API key" not in message
    emu.fail_next(50, 503, path="/identity/token")
    with pytest.raises(IksApiError, match=r"IAM at .* is unavailable \(HTTP 503"):
        replace(emu, "w1")


# 9. Health flapping ------------------------------------------------------------------------------------------------

def test_a_flapping_worker_counts_as_done_only_after_stable_readings(emu):
    old = emu.add_worker()["id"]
    emu.flap_new_workers = 4
    outs = replace(emu, old)
    assert outs["new_worker_id"] not in emu.flapping
    assert emu.workers[outs["new_worker_id"]]["health"]["state"] == "normal"


def test_temp_pool_workers_must_be_stable(emu):
    emu.flap_new_workers = 4
    result = TempGpuPoolProvider().create(pool_props(emu))
    assert not set(result.outs["worker_ids"]) & emu.flapping


# 11. The node behind a worker: what other entries recorded survives the provider process -------------------------

def test_a_resumed_replacement_skips_workers_another_entry_recorded_on_its_node(emu, kube):
    """A new provider process (the `up` after `pulumi refresh` found the worker replaced outside Pulumi) has no claims
    of its batch-mates; the config entry OperatorReadiness wrote on each replaced node tells them apart."""
    from iks_gpu_migration.kube.records import CONFIG_NAME_ANNOTATION
    from iks_gpu_migration.kube.inventory import IKS_WORKER_ID_LABEL
    recorded = emu.add_worker()  # its own replacement, recorded by the first run
    mate = emu.add_worker(version="1.36.1_1531")  # another entry's replaced worker, same pool and zone
    # The mate's node, on the real API server (tests/envtest.py; prefixed, as node names are cluster-wide there).
    node = kube.name(mate["networkInterfaces"][0]["ipAddress"])
    kube.add_node(node, labels={IKS_WORKER_ID_LABEL: mate["id"]})
    settings = {"kubeconfig": kube.kubeconfig, "timeout": 5, "poll_interval": 0.01}
    IksClient.from_api(emu.api()).replace_worker("gpu-cluster", recorded["id"])  # outside Pulumi
    for _ in range(4):
        emu.tick()
    (outside,) = [w["id"] for w in live_workers(emu) if w["id"] != mate["id"]]
    with pytest.raises(ReplacementError, match=rf"ambiguous \(.*{outside}.*\)"):
        replace(emu, recorded["id"], evict=settings)  # nothing recorded on the mate's node: refuses to guess
    kube.patch_node(node, {"metadata": {"annotations": {CONFIG_NAME_ANNOTATION: "10.240.0.12"}}})
    outs = replace(emu, recorded["id"], evict=settings)
    assert (outs["old_worker_id"], outs["new_worker_id"]) == (recorded["id"], outside)
    assert emu.replaced == [recorded["id"]]  # only the outside replace: none by the program
    kube.patch_node(node, {"metadata": {"annotations": {CONFIG_NAME_ANNOTATION: "10.240.0.9"}}})  # its own entry
    with pytest.raises(ReplacementError, match="ambiguous"):
        replace(emu, recorded["id"], evict=settings)


def test_a_finished_replacement_records_its_entry_on_the_new_node_at_once(emu, kube):
    """Before any later step runs (a kill may come next), so a batch-mate resumed after it counts the worker taken."""
    from iks_gpu_migration.kube.records import CONFIG_NAME_ANNOTATION
    old = emu.add_worker()["id"]
    IksClient.from_api(emu.api()).replace_worker("gpu-cluster", old)
    (new,) = live_workers(emu)
    node = kube.name("10.240.0.77")
    new["networkInterfaces"][0]["ipAddress"] = node
    kube.add_node(node)
    settings = {"kubeconfig": kube.kubeconfig, "timeout": 5, "poll_interval": 0.01}
    assert replace(emu, old, evict=settings)["new_worker_id"] == new["id"]
    assert kube.annotations(node).get(CONFIG_NAME_ANNOTATION) == "10.240.0.9"  # replacement_props' node_name


def test_a_resumed_replacement_whose_new_worker_failed_stops_at_once_and_never_follows_it(emu):
    """The run that requested the replacement was stopped; the only new worker of the zone then failed. The next `up`
    names it with IKS's message at once (not after the rebalancing grace or the timeout), and follows the worker
    that replaces it once the user replaced it as told."""
    old = emu.add_worker()["id"]
    emu.fail_new_workers = ("provision_failed", "Insufficient capacity for flavor gx3.16x80.l4 in zone us-south-1.")
    IksClient.from_api(emu.api()).replace_worker("gpu-cluster", old)  # requested by an earlier run
    for _ in range(4):
        emu.tick()
    (failed,) = [w["id"] for w in live_workers(emu)]
    with pytest.raises(ReplacementError) as raised:
        replace(emu, old, timeout=60, rebalance_timeout=60)
    message = str(raised.value)
    assert f"worker {failed}" in message and "provision_failed" in message and "Insufficient capacity" in message
    assert f"ibmcloud ks worker replace --cluster gpu-cluster --worker {failed}" in message
    emu.fail_new_workers = None
    IksClient.from_api(emu.api()).replace_worker("gpu-cluster", failed)  # what the message says to do
    outs = replace(emu, old)
    assert outs["new_worker_id"] not in (old, failed) and emu.replaced == [old, failed]


def test_a_worker_that_failed_before_its_replacement_is_named_not_replaced(emu):
    worker = emu.add_worker()
    worker["lifecycle"].update(actualState="reloading_failed", message="Reload failed: disk not found.")
    with pytest.raises(ReplacementError) as raised:
        replace(emu, worker["id"], timeout=60)
    message = str(raised.value)
    assert f"worker {worker['id']} of cluster gpu-cluster is reloading_failed: IKS says: Reload failed" in message
    assert "the replacement of" not in message and emu.count(*REPLACE) == 0


def test_the_master_is_described_without_calling_its_current_version_a_target():
    """Issue 39 §4: `master 1.35.4_1540 (target 1.35.4_1540)` read as if the program aimed at the version it leaves.
    IKS's targetVersion shows only while it differs, named as IKS's."""
    from iks_gpu_migration.iks.master import describe_master
    life = {"masterState": "deployed", "masterHealth": "normal", "masterStatus": "Ready"}
    at_rest = describe_master({"masterKubeVersion": "1.35.4_1540", "targetVersion": "1.35.4_1540", "lifecycle": life})
    assert at_rest == "master 1.35.4_1540 deployed/normal (Ready)"
    updating = describe_master({"masterKubeVersion": "1.35.4_1540", "targetVersion": "1.36.1_1530",
                                "lifecycle": {**life, "masterState": "updating"}})
    assert updating == "master 1.35.4_1540 (IKS targetVersion 1.36.1_1530) updating/normal (Ready)"
