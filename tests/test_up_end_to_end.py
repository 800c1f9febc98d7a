"""Temporary: the last scenarios still under the simulated engine (tests/e2e_up.py), until they are ported to the real
CLI (tests/real/); then this file and e2e_up.py go. The others moved to tests/real/test_migration_scenarios.py and
tests/real/test_safety_scenarios.py."""
import copy
import gc
import itertools
import logging

import pytest

from harness import stack_config
from tests.e2e_up import Cluster, RecordingIks, RecordingKube, Timeline, up

API_KEY = "test-api-key"
DRA, DP, IBM = "10.240.0.11", "10.240.0.12", "10.240.0.13"  # config names (old workers' IPs)
WORKERS = {DRA: "kube-pilot0001-gpu-00000101", DP: "kube-pilot0001-gpu-00000102", IBM: "kube-pilot0001-gpu-00000103"}
ER, DRIVER = "nvidia.com/gpu", "gpu.nvidia.com"


@pytest.fixture(autouse=True, scope="module")
def quiet_asyncio():
    """A failed registration under mocks leaves futures whose exception asyncio reports again on collection."""
    logger = logging.getLogger("asyncio")
    level, logger.level = logger.level, logging.CRITICAL
    yield
    gc.collect()  # report (silently) while still quiet
    logger.setLevel(level)


@pytest.fixture
def env(tmp_path):
    timeline = Timeline()
    iks = RecordingIks(timeline, cluster="gpu-pilot", master_version="1.35.4_1540", api_key=API_KEY).start()
    kube = RecordingKube(timeline).start()
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    cluster = Cluster(iks, kube, timeline, kubeconfig, ER, DRIVER)
    for name, worker_id in WORKERS.items():
        worker = iks.add_worker(pool_name="gpu", worker_id=worker_id)
        worker["networkInterfaces"][0]["ipAddress"] = name
        cluster.add_ibm_node(name)
    iks._ids = itertools.count(1000)  # replacements get IPs 10.240.0.2, .3, ... (never a config name)
    yield cluster
    kube.stop()
    iks.stop()


def pilot_config(cluster: Cluster, operator_ready: float = 5, **stages) -> dict:
    raw = copy.deepcopy(stack_config("pilot"))
    for node in raw["nodes"]:
        node["stage"] = stages.get(node["name"], node["stage"])
    raw["kubeconfig"] = cluster.kubeconfig
    raw["ibmCloud"] = {"endpoint": cluster.iks.url, "iamEndpoint": cluster.iks.url}
    raw["timeouts"] = {"masterUpdate": 5, "workerReplace": 5, "workerPool": 5, "operatorReady": operator_ready,
                       "smokeTest": 5, "drain": 5, "evict": 5, "pollInterval": 0.02}
    return raw


def fresh_up(cluster: Cluster):
    result = up(cluster, pilot_config(cluster), API_KEY)
    assert result.error is None, f"{result.error}\n{cluster.timeline.dump()}"
    return result


# 4. the node switch, convergence and the inventory -------------------------------------------------------------------

def test_an_unlisted_gpu_node_on_ibm_drivers_stops_up_before_the_operator(env):
    env.add_ibm_node("10.240.0.99")
    result = up(env, pilot_config(env), API_KEY)
    assert result.error is not None
    assert "GPU node 10.240.0.99 (kubelet v1.35.4+IKS" in str(result.error)
    assert "is not listed in gpu-migration:nodes: it runs IBM-managed drivers" in str(result.error)
    assert not env.timeline.all("helm install") and not env.timeline.all("iks POST /v2/vpc/replaceWorker")


# 5. issue 10: kubeVersion bump with migrated nodes; renaming the config entries or not --------------------------

def test_kube_version_bump_replaces_each_migrated_worker_once_from_state(env):
    t = env.timeline
    raw = pilot_config(env, **{DRA: "device-plugin"})
    raw["kubeVersion"] = "1.36"
    first = up(env, raw, API_KEY)
    assert first.error is None, f"{first.error}\n{t.dump()}"
    migrated = {name: first.outputs(f"{name}-replacement")["new_worker_id"] for name in (DRA, DP)}
    mark = t.add("bump").seq

    second = up(env, {**raw, "kubeVersion": "1.37"}, API_KEY, prior=first.state)  # the config is not renamed
    assert second.error is None, f"{second.error}\n{t.dump()}"
    replaces = [e for e in t.all("iks POST /v2/vpc/replaceWorker") if e.seq > mark]
    assert [e.detail["worker"] for e in replaces] == [migrated[DRA], migrated[DP]]  # current IDs, once each, in order
    ready1 = max(e.seq for e in t.events if e.seq > mark and e.kind in ("update", "replace", "create")
                 and e.detail.get("name") == f"{DRA}-operator-ready")
    assert ready1 < replaces[1].seq  # one node at a time, behind node 1's readiness
    for name in (DRA, DP):
        outs = second.outputs(f"{name}-replacement")
        assert outs["old_worker_id"] == migrated[name] and outs["actual_version"].startswith("1.37.")
        assert env.iks.workers[outs["new_worker_id"]]["lifecycle"]["actualState"] == "deployed"


def renamed(raw: dict, result, keep_key: bool) -> dict:
    """What following the old rename advice did: name -> the new node, workerId -> the new worker."""
    raw = copy.deepcopy(raw)
    for node in raw["nodes"]:
        if node["stage"] == "ibm-managed":
            continue
        outs = result.outputs(f"{node['name']}-replacement")
        if keep_key:
            node["key"] = node["name"]
        node.update(name=outs["node_name"], workerId=outs["new_worker_id"])
    return raw


@pytest.mark.parametrize("keep_key", [True, False])
def test_renaming_the_nodes_or_not_both_converge(env, keep_key):
    t = env.timeline
    raw = pilot_config(env)
    first = fresh_up(env)
    same = up(env, raw, API_KEY, prior=first.state)
    assert same.error is None, f"{same.error}\n{t.dump()}"
    mark = t.add("renamed").seq
    second = up(env, renamed(raw, first, keep_key), API_KEY, prior=same.state)
    assert second.error is None, f"{second.error}\n{t.dump()}"
    after = [e for e in t.events if e.seq > mark]
    assert not [e for e in after if e.kind == "iks POST /v2/vpc/replaceWorker"]
    assert len(t.all("iks POST /v2/vpc/replaceWorker")) == 2
    if keep_key:  # same resources: only the fences and batch gates (read-only checks on named nodes) run again
        changed = {e.detail["name"] for e in after if e.kind in ("create", "replace", "delete")}
        assert changed <= {f"{DRA}-fence", f"{DP}-fence", "batch-1-gate", "batch-2-gate"}, changed
