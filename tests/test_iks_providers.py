"""The IKS dynamic providers against the local IKS/IAM emulator, through the real ibm-cloud-sdk-core client."""
import asyncio
import base64
import os
import pathlib
import subprocess
import sys
import json
import threading
from typing import Optional

import dill
import grpc
import pulumi
import pytest
from pulumi.dynamic import ConfigureRequest
from pulumi.dynamic.config import Config as DynamicConfig
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import proto, rpc
from pulumi.runtime.proto import provider_pb2_grpc


from iks_gpu_migration.iks.api import IksApiError, IksClient
from iks_gpu_migration.common.waiting import WaitTimeout
from tests.emulators.iks import IksEmulator
from iks_gpu_migration.iks.master import MasterVersion, MasterVersionProvider
from iks_gpu_migration.iks.pool import TempGpuPool, TempGpuPoolProvider
from iks_gpu_migration.iks.provider import ReplacementError
from iks_gpu_migration.iks.replacement import WorkerReplacement, WorkerReplacementProvider

FAST = {"timeout": 5, "poll_interval": 0.01}
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def emu():
    emulator = IksEmulator(master_version="1.36.1_1530").start()
    yield emulator
    emulator.stop()


def replacement_props(emu: IksEmulator, worker_id: str, **overrides) -> dict:
    return {"cluster": "gpu-cluster", "worker_id": worker_id, "node_name": "10.240.0.9", "kube_version": "1.36",
            "api": emu.api(), **FAST, **overrides}


def pool_props(emu: IksEmulator, **overrides) -> dict:
    return {"cluster": "gpu-cluster", "pool_name": "gpu-migration-temp", "flavor": "gx3.16x80.l4",
            "zone": "us-south-1", "vpc_id": "vpc-1", "subnet_id": "subnet-1", "size_per_zone": 2,
            "api": emu.api(), **FAST, **overrides}


def replace(emu: IksEmulator, worker_id: str, stack_config: Optional[dict] = None, **overrides) -> dict:
    """A replacement's create; with `stack_config` the provider is first configured with it, as the provider host
    does with the stack's whole config (values as text, pulumi/dynamic/__main__.py get_provider)."""
    provider = WorkerReplacementProvider()
    if stack_config is not None:
        provider.configure(ConfigureRequest(DynamicConfig(stack_config, "gpu-migration")))
    return provider.create(replacement_props(emu, worker_id, **overrides)).outs


def replace_together(emu: IksEmulator, olds: list[str], join_timeout: float = 40, **overrides) -> dict[str, object]:
    """One replacement per worker in `olds`, concurrently (as the provider host runs a batch); each its outputs or
    the exception it raised, asserted by the caller."""
    results: dict[str, object] = {}

    def run(old: str) -> None:
        try:
            results[old] = replace(emu, old, **{"timeout": 20, **overrides})
        except Exception as e:  # noqa: BLE001 - asserted by the caller
            results[old] = e

    threads = [threading.Thread(target=run, args=(old,)) for old in olds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
    return results


def live_workers(emu: IksEmulator) -> list[dict]:
    return [w for w in emu.workers.values() if w["lifecycle"]["desiredState"] == "deployed"]


# Master -------------------------------------------------------------------------------------------------------

def master_props(emu: IksEmulator, version: str = "1.36") -> dict:
    return {"cluster": "gpu-cluster", "version": version, "api": emu.api(), **FAST}


def test_master_is_updated_and_waited_for():
    emu = IksEmulator(master_version="1.35.4_1540").start()
    try:
        result = MasterVersionProvider().create(master_props(emu))
        assert result.outs["actual_version"] == "1.36.1_1530"
        assert emu.cluster["lifecycle"]["masterState"] == "deployed"
        assert emu.count("PUT", "/v1/clusters/gpu-cluster") == 1
        assert "api_key" not in result.outs["api"]
    finally:
        emu.stop()


def test_master_is_updated_one_minor_version_at_a_time():
    emu = IksEmulator(master_version="1.35.4_1540").start()
    try:
        result = MasterVersionProvider().create(master_props(emu, version="1.37"))
        assert result.outs["actual_version"] == "1.37.0_1501"
        assert emu.count("PUT", "/v1/clusters/gpu-cluster") == 2  # 1.36, then 1.37
    finally:
        emu.stop()


def test_master_steps():
    from iks_gpu_migration.common.versions import minor_steps
    assert minor_steps("1.35.4_1540", "1.37") == ["1.36", "1.37"]
    assert minor_steps("1.35.4_1540", "1.36") == ["1.36"]
    assert minor_steps("1.37.0_1501", "1.36") == [] == minor_steps("1.36.1_1530", "1.36")


def test_master_at_target_is_not_updated(emu):
    result = MasterVersionProvider().create(master_props(emu))
    assert result.outs["actual_version"] == "1.36.1_1530"
    assert emu.count("PUT", "/v1/clusters/gpu-cluster") == 0


def test_master_update_in_progress_is_waited_for_not_requested_again():
    emu = IksEmulator(master_version="1.35.4_1540").start()
    try:
        IksClient.from_api(emu.api()).update_master("gpu-cluster", "1.36")  # an earlier, interrupted run
        result = MasterVersionProvider().create(master_props(emu))
        assert result.outs["actual_version"] == "1.36.1_1530"
        assert emu.count("PUT", "/v1/clusters/gpu-cluster") == 1
    finally:
        emu.stop()


def test_refused_master_update_names_cluster_and_api_message():
    emu = IksEmulator(master_version="1.35.4_1540").start()
    emu.refuse_master_update = (409, "The cluster master is locked for maintenance.")
    try:
        with pytest.raises(IksApiError, match=r"master of cluster gpu-cluster to 1\.36.*HTTP 409.*locked"):
            MasterVersionProvider().create(master_props(emu, "1.36"))
    finally:
        emu.stop()


def test_unoffered_version_updates_nothing(emu):
    with pytest.raises(IksApiError, match=r"kubeVersion 1\.39: master of cluster gpu-cluster is at 1\.36\.1_1530 and "
                                          r"IKS offers no Kubernetes 1\.38, 1\.39 .*nothing was updated"):
        MasterVersionProvider().create(master_props(emu, "1.39"))
    assert emu.count("PUT", "/v1/clusters/gpu-cluster") == 0


def test_master_version_change_is_an_update_cluster_change_a_replace():
    olds = {"cluster": "c", "version": "1.36"}
    provider = MasterVersionProvider()
    assert provider.diff("c", olds, {"cluster": "c", "version": "1.36"}).changes is False
    assert provider.diff("c", olds, {"cluster": "c", "version": "1.37"}).replaces == []
    assert provider.diff("c", olds, {"cluster": "c", "version": "1.37"}).changes is True
    assert provider.diff("c", olds, {"cluster": "d", "version": "1.36"}).replaces == ["cluster"]


# Worker replacement -------------------------------------------------------------------------------------------

def test_worker_is_replaced_at_target_version(emu):
    old = emu.add_worker()["id"]
    outs = replace(emu, old)
    new = emu.workers[outs["new_worker_id"]]
    assert outs["old_worker_id"] == old and outs["new_worker_id"] != old
    assert new["kubeVersion"]["actual"] == "1.36.1_1531" and new["health"]["message"] == "Ready"
    assert outs["node_name"] == new["networkInterfaces"][0]["ipAddress"] != "10.240.0.9"
    assert outs["kube_version"] == "1.36" and outs["actual_version"] == "1.36.1_1531"
    assert emu.workers[old]["lifecycle"]["desiredState"] == "deleted"
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 1
    assert "api_key" not in outs["api"]


def test_replace_that_shows_up_late_is_requested_once(emu):
    old = emu.add_worker()["id"]
    emu.replace_lag = 3  # the old worker still looks deployed for a few polls after the request
    outs = replace(emu, old)
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 1
    assert outs["new_worker_id"] != old and len(live_workers(emu)) == 1


def test_replacement_is_told_apart_from_another_worker_provisioning_in_the_zone(emu):
    old = emu.add_worker()["id"]
    busy = emu.add_worker(state="provisioning")["id"]  # e.g. another node's worker being reloaded
    emu.stick(busy)
    outs = replace(emu, old)
    assert outs["new_worker_id"] not in (old, busy)
    assert emu.workers[outs["new_worker_id"]]["health"]["message"] == "Ready"


def test_5xx_are_retried_by_the_sdk_without_a_second_replacement(emu):
    old = emu.add_worker()["id"]
    emu.fail_next(2, 503, path="/v2/vpc/replaceWorker")
    emu.fail_next(3, 500, path="/v2/vpc/getWorkers")
    outs = replace(emu, old)
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 3  # two 503s, then accepted
    assert len(live_workers(emu)) == 1 and outs["new_worker_id"] in emu.workers


def test_5xx_beyond_the_retry_budget_is_an_error_naming_the_call(emu):
    emu.add_worker(worker_id="w1")
    emu.fail_next(50, 503, path="/v2/vpc/getWorkers")
    with pytest.raises(IksApiError, match=r"list workers of cluster gpu-cluster failed.*(503|too many)"):
        replace(emu, "w1")
    assert emu.count("GET", "/v2/vpc/getWorkers") == 5  # 1 + max_retries
    assert emu.workers["w1"]["lifecycle"]["actualState"] == "deployed"


def test_expired_token_is_refreshed_once_and_the_call_retried(emu):
    old = emu.add_worker()["id"]
    emu.expire_tokens_on("/v2/vpc/replaceWorker")
    outs = replace(emu, old)
    assert outs["new_worker_id"] != old
    assert emu.count("POST", "/identity/token") == 2
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 2  # 401, then accepted with the new token


def test_client_refreshes_only_once_per_call(emu):
    client = IksClient.from_api(emu.api())
    client.get_cluster("gpu-cluster")
    emu.expire_tokens()
    assert client.get_cluster("gpu-cluster")["name"] == "gpu-cluster"
    assert emu.count("POST", "/identity/token") == 2


def test_operations_of_one_process_share_the_iam_token(emu):
    """The provider process's operations share one client per API, key and retry settings (one HTTP session: its SSL
    context is built once) and one IAM token: a batch's replacements do not each ask IAM for one, and the refresh
    after a 401 serves every operation after it."""
    first, second = IksClient.from_api(emu.api()), IksClient.from_api(emu.api())
    assert first is second
    other_retries = IksClient.from_api({**emu.api(), "max_retries": 1})
    assert other_retries is not first and other_retries.authenticator is first.authenticator
    first.get_cluster("gpu-cluster")
    second.get_cluster("gpu-cluster")
    assert emu.count("POST", "/identity/token") == 1
    emu.expire_tokens()
    first.get_cluster("gpu-cluster")
    second.get_cluster("gpu-cluster")
    assert emu.count("POST", "/identity/token") == 2
    # Another key (or another IAM endpoint) has its own token.
    emu.keys["other-key"] = "Operator"
    IksClient.from_api(emu.api(api_key="other-key")).get_cluster("gpu-cluster")
    assert emu.count("POST", "/identity/token") == 3


def test_bad_api_key_names_iam_and_its_message(emu):
    with pytest.raises(IksApiError, match=r"IAM token request .* failed.*Provided API key could not be found"):
        replace(emu, "w1", api=emu.api(api_key="wrong"))


def test_api_key_falls_back_to_env_then_fails_clearly(emu, monkeypatch):
    emu.add_worker(version="1.36.1_1530", worker_id="w1")
    monkeypatch.setenv("IC_API_KEY", "test-api-key")
    assert replace(emu, "w1", api=emu.api(api_key=None))["new_worker_id"] == "w1"
    monkeypatch.delenv("IC_API_KEY")
    with pytest.raises(IksApiError, match=r"gpu-migration:ibmApiKey.*IC_API_KEY"):
        replace(emu, "w1", api=emu.api(api_key=None))


def test_api_key_from_stack_config_via_configure(emu, monkeypatch):
    monkeypatch.delenv("IC_API_KEY", raising=False)
    emu.add_worker(version="1.36.1_1530", worker_id="w1")
    provider = WorkerReplacementProvider()
    config = pulumi.dynamic.Config({"gpu-migration:ibmApiKey": "test-api-key"}, "gpu-migration")
    provider.configure(pulumi.dynamic.ConfigureRequest(config))
    assert provider.create(replacement_props(emu, "w1", api=emu.api(api_key=None))).outs["new_worker_id"] == "w1"


def test_stuck_provisioning_times_out_naming_workers_state_and_resume(emu):
    old = emu.add_worker()["id"]
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout) as raised:
        replace(emu, old, timeout=0.3)
    (new,) = live_workers(emu)
    message = str(raised.value)
    assert f"worker {old}" in message and new["id"] in message
    assert "provisioning" in message and "re-running `pulumi up` resumes" in message


def test_refused_replace_is_a_clear_error_and_leaves_the_worker_untouched(emu):
    old = emu.add_worker()["id"]
    emu.refuse_replace[old] = (409, "The worker node cannot be replaced while the pool is rebalancing.")
    with pytest.raises(IksApiError, match=rf"refused the replacement, worker {old} is unchanged: replace worker "
                                          rf"{old} of cluster gpu-cluster failed: HTTP 409: .*rebalancing"):
        replace(emu, old)
    assert list(emu.workers) == [old]
    assert emu.workers[old]["lifecycle"]["actualState"] == "deployed"


def test_interrupted_replacement_resumes_without_replacing_again(emu):
    old = emu.add_worker()["id"]
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout):
        replace(emu, old, timeout=0.2)
    (pending,) = [w["id"] for w in live_workers(emu)]
    emu.stuck.clear()
    outs = replace(emu, old)  # what the next `pulumi up` does: create again with the same inputs
    assert (outs["old_worker_id"], outs["new_worker_id"]) == (old, pending)
    assert emu.workers[pending]["health"]["message"] == "Ready"
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_resume_after_the_replacement_finished_skips_other_nodes_workers(emu):
    old = emu.add_worker()["id"]
    sibling = emu.add_worker(version="1.36.1_1530")["id"]  # another node, already migrated, same pool and zone
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout):
        replace(emu, old, timeout=0.2)
    emu.stuck.clear()
    for _ in range(3):
        emu.tick()  # the replacement finishes while no `pulumi up` is watching
    (new,) = [w for w in live_workers(emu) if w["id"] != sibling]
    assert new["lifecycle"]["actualState"] == "deployed"
    with pytest.raises(ReplacementError, match=rf"ambiguous \(.*{new['id']}.*\).*set workerId"):
        replace(emu, old)  # without knowing the other nodes' workers it refuses to guess
    outs = replace(emu, old, other_worker_ids=[sibling])
    assert (outs["old_worker_id"], outs["new_worker_id"]) == (old, new["id"])
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_concurrent_replacements_in_one_pool_and_zone_each_claim_their_own_new_worker(emu):
    """Two nodes of one batch, same pool and zone: each replacement sees both new workers appear after its request
    (IKS links a new worker to nothing). Each claims one; none is followed twice, nothing is ambiguous."""
    olds = [emu.add_worker()["id"], emu.add_worker()["id"]]
    emu.replace_lag = 40  # both requests are in before either new worker shows (requests tick the emulator)
    results = replace_together(emu, olds, join_timeout=30)
    assert all(isinstance(r, dict) for r in results.values()), results
    new_ids = [results[old]["new_worker_id"] for old in olds]
    assert len(set(new_ids)) == 2 and not set(new_ids) & set(olds)
    assert {w["id"] for w in live_workers(emu)} == set(new_ids)
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 2


def test_a_claimed_new_worker_is_never_another_replacements_candidate(emu):
    old = emu.add_worker()["id"]
    mate = emu.add_worker()["id"]
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout):
        replace(emu, mate, timeout=0.2)  # the mate's replacement follows (claims) its new worker, still provisioning
    (claimed,) = [w["id"] for w in live_workers(emu) if w["id"] != old]
    emu.stick_new_workers = False
    # `old` was replaced by an earlier run; its new worker is provisioning too: two workers in flight in the zone.
    emu._delete_worker(emu.workers[old], "worker_replace")
    own = emu.add_worker(state="provisioning", grow=False, version="1.36.1_1530")["id"]
    outs = replace(emu, old)  # resumes: the mate's claimed worker is no candidate, so this is not ambiguous
    assert (outs["old_worker_id"], outs["new_worker_id"]) == (old, own)
    assert claimed in emu.stuck and emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_batch_mates_whose_up_was_killed_after_both_requests_resume_to_different_workers(emu, monkeypatch):
    """`up` killed right after both replaceWorker calls of one pool and zone: the next `up`'s resumed replacements
    (no claims, nothing recorded on a node) pair the two new workers by entry name and worker ID, in any order, each
    in a provider process of its own; no replace is requested again and nothing is ambiguous."""
    from iks_gpu_migration.iks import claims
    olds = {"10.240.0.11": emu.add_worker()["id"], "10.240.0.12": emu.add_worker()["id"]}
    client = IksClient.from_api(emu.api())
    for old in olds.values():
        client.replace_worker("gpu-cluster", old)  # by the killed run
    news = sorted(w["id"] for w in live_workers(emu))
    assert len(news) == 2
    # The entries come from gpu-migration:nodes, as the engine passes the stack config to a dynamic provider.
    config = {"gpu-migration:nodes": json.dumps([{"name": e, "workerId": w, "stage": "device-plugin"}
                                                 for e, w in olds.items()]), "gpu-migration:clusterName": "gpu-cluster"}
    for order in (["10.240.0.12", "10.240.0.11"], ["10.240.0.11", "10.240.0.12"]):
        got = {}
        for entry in order:
            monkeypatch.setattr(claims, "CLAIMS", claims.NewWorkerClaims())  # a new provider process each
            outs = replace(emu, olds[entry], stack_config=config, node_name=entry)
            got[entry] = outs["new_worker_id"]
            # Outputs repeat only what diff and read use: every node's copy is rewritten with every state save.
            assert set(outs) == {"api", "cluster", "kube_version", "worker_id", "node_name", "old_worker_id",
                                 "new_worker_id", "actual_version", "drained"}
        assert got == {"10.240.0.11": news[0], "10.240.0.12": news[1]}
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 2
    monkeypatch.setattr(claims, "CLAIMS", claims.NewWorkerClaims())
    with pytest.raises(ReplacementError, match="ambiguous"):
        replace(emu, olds["10.240.0.11"])  # without the entries: two candidates, no guess


def test_resume_waits_while_the_replacement_is_not_created_yet(emu):
    old = emu.add_worker()["id"]
    migrated = emu.add_worker(version="1.36.1_1530")["id"]
    emu._delete_worker(emu.workers[old], "worker_replace")  # replaced by an earlier run; new worker not there yet
    with pytest.raises(WaitTimeout, match="not visible yet"):
        replace(emu, old, timeout=0.2)
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 0 and migrated in emu.workers




def test_already_migrated_worker_is_recorded_not_replaced(emu):
    worker = emu.add_worker(version="1.36.1_1530")
    outs = replace(emu, worker["id"])
    assert outs["old_worker_id"] == outs["new_worker_id"] == worker["id"]
    assert outs["node_name"] == worker["networkInterfaces"][0]["ipAddress"]
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 0


def test_only_gpu_node_is_not_replaced_without_a_temp_pool(emu):
    old = emu.add_worker()["id"]
    with pytest.raises(ReplacementError, match=rf"worker {old} is the only GPU node .* enable "
                                                   r"gpu-migration:tempGpuPool .* Nothing was replaced"):
        replace(emu, old, single_gpu_node=True)
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 0
    migrated = emu.add_worker(version="1.36.1_1530")["id"]  # already done: recorded, no temp pool needed
    assert replace(emu, migrated, single_gpu_node=True)["new_worker_id"] == migrated


BAD_NODE_NAMES = ["10.240.0.5,metadata.name!=x", "10.240.0.5 ", "a" * 64, "../10.240.0.5"]


@pytest.mark.parametrize("bad", BAD_NODE_NAMES)
def test_a_node_name_from_iks_that_no_configured_name_could_be_stops_before_any_use(emu, bad):
    """The worker's primary IP becomes the node name in field and label selectors (spec.nodeName=..., hostname=...):
    read from IKS, it passes the grammar configured names pass, else one error names the worker and the value."""
    worker = emu.add_worker()
    worker["networkInterfaces"][0]["ipAddress"] = bad
    with pytest.raises(IksApiError) as stopped:
        replace(emu, worker["id"], evict={"kubeconfig": "/nonexistent"})
    assert f"IKS reports worker {worker['id']} with primary IP {bad[:80]!r}" in str(stopped.value)
    assert emu.count("POST", "/v2/vpc/replaceWorker") == 0


def test_a_new_worker_with_a_bad_node_name_is_never_recorded(emu, monkeypatch):
    old = emu.add_worker()["id"]
    new_worker = emu._new_worker

    def bad_ip(*args, **kwargs):
        worker = new_worker(*args, **kwargs)
        worker["networkInterfaces"][0]["ipAddress"] = "10.240.0.9,spec.nodeName!=x"
        return worker
    monkeypatch.setattr(emu, "_new_worker", bad_ip)
    with pytest.raises(IksApiError, match=r"IKS reports worker kube-.* with primary IP '10.240.0.9,spec.nodeName!=x'"):
        replace(emu, old)


def test_unknown_worker_is_an_error_naming_it(emu):
    with pytest.raises(ReplacementError, match=r"worker nope not found in cluster gpu-cluster"):
        replace(emu, "nope")


def test_diff_accepts_the_recorded_new_worker_id(emu):
    old = emu.add_worker()["id"]
    olds = replace(emu, old)
    provider = WorkerReplacementProvider()
    news = replacement_props(emu, olds["new_worker_id"], node_name=olds["node_name"])
    assert provider.diff(old, olds, news).changes is False
    assert provider.diff(old, olds, replacement_props(emu, old)).changes is False
    other = provider.diff(old, olds, replacement_props(emu, "another-worker"))
    assert other.changes is True and other.replaces == ["worker_id"]
    bump = provider.diff(old, olds, replacement_props(emu, old, kube_version="1.37"))
    assert bump.changes is True and bump.replaces == []  # an update: replaces the current worker from state


def test_delete_is_a_no_op(emu):
    old = emu.add_worker()["id"]
    outs = replace(emu, old)
    before = len(emu.requests)
    WorkerReplacementProvider().delete(old, outs)
    assert len(emu.requests) == before
    assert emu.workers[outs["new_worker_id"]]["lifecycle"]["actualState"] == "deployed"


# Temporary GPU pool -------------------------------------------------------------------------------------------

def test_temp_pool_is_created_ready_and_removed(emu, monkeypatch):
    monkeypatch.delenv("IC_API_KEY", raising=False)
    provider = TempGpuPoolProvider()
    # outputs hold no API key: delete gets it from the stack config the engine hands to `configure`
    provider.configure(pulumi.dynamic.ConfigureRequest(
        pulumi.dynamic.Config({"gpu-migration:ibmApiKey": "test-api-key"}, "gpu-migration")))
    result = provider.create(pool_props(emu))
    pool = next(p for p in emu.pools.values() if p["poolName"] == "gpu-migration-temp")
    assert result.id == pool["id"] and len(result.outs["worker_ids"]) == 2
    assert all(emu.workers[w]["health"]["message"] == "Ready" for w in result.outs["worker_ids"])
    assert emu.count("POST", "/v2/vpc/createWorkerPool") == 1
    provider.delete(result.id, result.outs)
    assert pool["lifecycle"]["actualState"] == "deleted" and pool["zones"] == []  # stays readable (#3595)
    assert all(emu.workers[w]["lifecycle"]["actualState"] == "deleted" for w in result.outs["worker_ids"])


def test_existing_temp_pool_is_adopted(emu):
    for _ in range(2):
        emu.add_worker(pool_name="gpu-migration-temp", version="1.36.1_1530")
    result = TempGpuPoolProvider().create(pool_props(emu))
    assert emu.count("POST", "/v2/vpc/createWorkerPool") == 0
    assert sorted(result.outs["worker_ids"]) == sorted(emu.workers)


def test_temp_pool_that_never_gets_ready_times_out_naming_it(emu):
    emu.stick_new_workers = True
    with pytest.raises(WaitTimeout, match=r"pool gpu-migration-temp.*0/2 ready.*provisioning"):
        TempGpuPoolProvider().create(pool_props(emu, timeout=0.2))


def test_temp_pool_shape_change_replaces_it_first(emu):
    olds = TempGpuPoolProvider().create(pool_props(emu)).outs
    provider = TempGpuPoolProvider()
    assert provider.diff("p", olds, pool_props(emu, timeout=99)).changes is False
    diff = provider.diff("p", olds, pool_props(emu, flavor="gx3.24x120.l40s"))
    assert diff.replaces == ["flavor"] and diff.delete_before_replace is True


def test_deleting_a_missing_pool_is_fine(emu, monkeypatch):
    monkeypatch.setenv("IC_API_KEY", "test-api-key")
    TempGpuPoolProvider().delete("gone", pool_props(emu, api=emu.api(api_key=None)))
    assert emu.count("DELETE", "/v1/clusters/gpu-cluster/workerpools/gpu-migration-temp") == 0


# Declared under Pulumi mocks: the providers must pickle with dill --------------------------------------------

class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.inputs: dict[str, dict] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.inputs[args.name] = dict(args.inputs)
        extra = {"new_worker_id": "w1-new"} if "worker_id" in args.inputs else {}
        return f"{args.name}-id", {**args.inputs, **extra}

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def test_resources_declare_and_their_providers_serialize():
    mocks = Mocks()
    pulumi.runtime.set_mocks(mocks, project="gpu-migration", stack="test", preview=False)
    api = {"endpoint": "http://x", "iam_endpoint": "http://y", "api_key": pulumi.Output.secret("k")}
    seen: dict[str, object] = {}

    @pulumi.runtime.test
    def program():
        master = MasterVersion("master-version", cluster="c", version="1.36", api=api)
        worker = WorkerReplacement("n1-replacement", cluster="c", worker_id="w1", node_name="10.0.0.1",
                                       kube_version="1.36", api=api, timeout=60, poll_interval=1,
                                       opts=pulumi.ResourceOptions(depends_on=[master]))
        pool = TempGpuPool("temp-gpu-pool", cluster="c", pool_name="p", flavor="f", zone="z", vpc_id="v",
                               subnet_id="s", size_per_zone=1, api=api)
        return pulumi.Output.all(worker.new_worker_id, worker.node_name, pool.pool_name, master.version).apply(
            lambda values: seen.update(outputs=values))

    program()
    assert seen["outputs"] == ["w1-new", "10.0.0.1", "p", "1.36"]
    kinds = {"master-version": MasterVersionProvider, "n1-replacement": WorkerReplacementProvider,
             "temp-gpu-pool": TempGpuPoolProvider}
    for name, kind in kinds.items():
        serialized = mocks.inputs[name]["__provider"]
        if isinstance(serialized, dict):  # a secret, as the SDK always marks the serialized provider
            serialized = serialized["value"]
        provider = dill.loads(base64.b64decode(serialized))
        assert type(provider).__name__ == kind.__name__
        assert callable(provider.create)


def test_version_and_readiness_helpers():
    from iks_gpu_migration.iks.workers import is_ready
    from iks_gpu_migration.common.versions import version_at_least
    assert version_at_least("1.36.1_1530", "1.36") and version_at_least("1.37.0_1501", "1.36")
    assert not version_at_least("1.35.4_1540", "1.36") and not version_at_least("", "1.36")
    assert not version_at_least("1.36.1_1530", "1.36.2")
    worker = {"lifecycle": {"actualState": "deployed"}, "health": {"state": "normal", "message": "Ready"}}
    assert is_ready(worker)
    assert not is_ready({**worker, "health": {"state": "normal", "message": "Not Ready"}})
    assert not is_ready({**worker, "health": {"state": "warning", "message": "Ready"}})
    assert not is_ready({**worker, "lifecycle": {"actualState": "deployed", "pendingOperation": "reloading"}})


def test_create_in_the_real_dynamic_provider_host_with_the_key_from_stack_config(emu, tmp_path):
    """What `pulumi up` does: a separate `python -m pulumi.dynamic` process unpickles the provider, gets the stack
    config through Configure, and runs Create over gRPC."""
    env = {k: v for k, v in os.environ.items() if k != "IC_API_KEY"}
    log = (tmp_path / "host.log").open("w")  # the host's pulumi.log lines (stderr outside the engine)
    host = subprocess.Popen([sys.executable, "-m", "pulumi.dynamic"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        port = int(host.stdout.readline())
        stub = provider_pb2_grpc.ResourceProviderStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        old = emu.add_worker()["id"]
        props = {**replacement_props(emu, old, api=emu.api(api_key=None)), "other_worker_ids": [],
                 "__provider": serialize_provider(WorkerReplacementProvider())}
        config = {"gpu-migration:ibmApiKey": "test-api-key"}
        stub.Configure(proto.ConfigureRequest(args=asyncio.run(rpc.serialize_properties(config, {}))), timeout=10)
        response = stub.Create(proto.CreateRequest(
            urn="urn:pulumi:test::gpu-migration::pulumi-python:dynamic/gpu-migration:WorkerReplacement::n1-replacement",
            properties=asyncio.run(rpc.serialize_properties(props, {}))), timeout=30)
        outs = rpc.deserialize_properties(response.properties)
        assert response.id == old and outs["old_worker_id"] == old and outs["new_worker_id"] in emu.workers
        assert "test-api-key" not in str(outs)
        assert f"replacing worker {old}" in (tmp_path / "host.log").read_text()
    finally:
        host.kill()
        host.wait()
        log.close()


def test_config_entries_are_read_from_the_stack_config_as_the_engine_passes_it():
    from iks_gpu_migration.iks.provider import config_entries
    nodes = [{"name": "10.240.0.11", "workerId": "w1", "stage": "dra"}, {"name": "10.240.0.12", "workerId": "w2"}]
    assert config_entries(json.dumps(nodes)) == config_entries(nodes) == {"10.240.0.11": "w1", "10.240.0.12": "w2"}
    assert config_entries(None) == config_entries("{not json") == config_entries('{"name": "x"}') == {}
    assert config_entries(json.dumps([{"name": "x"}, "y", {"workerId": "w"}])) == {}  # validated by the program
    provider = WorkerReplacementProvider()
    provider.configure(ConfigureRequest(DynamicConfig({"gpu-migration:nodes": json.dumps(nodes)}, "gpu-migration")))
    assert provider.entries({}) == {"10.240.0.11": "w1", "10.240.0.12": "w2"}
    assert provider.entries({"entries": {"a": "w9"}}) == {"a": "w9"}  # a provider used on its own, given them
    assert WorkerReplacementProvider().entries({}) == {}  # not configured (tests): none
