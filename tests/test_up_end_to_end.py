"""`pulumi up` of the pilot stack, end to end: every dynamic resource runs its real provider against the IKS and
Kubernetes emulators (tests/e2e_up.py plays the engine and the cluster), so the order of real API calls is the order
the program's dependencies allow."""
import copy
import gc
import itertools
import json
import logging

import pytest

from iks_gpu_migration.kube_providers import VERIFICATION_ANNOTATION
from harness import stack_config
from tests.e2e_up import Cluster, RecordingIks, RecordingKube, Timeline, gpu_uuid, up

API_KEY = "test-api-key"
DRA, DP, IBM = "10.240.0.11", "10.240.0.12", "10.240.0.13"  # config names (old workers' IPs)
WORKERS = {DRA: "kube-pilot0001-gpu-00000101", DP: "kube-pilot0001-gpu-00000102", IBM: "kube-pilot0001-gpu-00000103"}
PILOT_KEY, PLUGIN_OFF = "migration.example.com/gpu-dra", "nvidia.com/gpu.deploy.device-plugin"
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


def new_node(result, config_name: str) -> str:
    return result.outputs(f"{config_name}-replacement")["node_name"]


def labels(cluster: Cluster, node: str) -> dict:
    return cluster.kube.nodes[node]["metadata"].get("labels") or {}


def verification(cluster: Cluster, node: str) -> dict:
    return json.loads(cluster.kube.nodes[node]["metadata"]["annotations"][VERIFICATION_ANNOTATION])


def fresh_up(cluster: Cluster):
    result = up(cluster, pilot_config(cluster), API_KEY)
    assert result.error is None, f"{result.error}\n{cluster.timeline.dump()}"
    return result


# 1. fresh pilot up ------------------------------------------------------------------------------------------------

def test_fresh_pilot_up(env):
    t = env.timeline
    result = fresh_up(env)
    dra, dp = new_node(result, DRA), new_node(result, DP)

    # The master goes 1.35 -> 1.36 -> 1.37 first (one minor at a time); no worker is replaced before it is done.
    assert env.iks.cluster["masterKubeVersion"] == "1.37.0_1501"
    masters = t.all("iks PUT /v1/clusters/gpu-pilot")
    assert [e.detail["body"]["version"] for e in masters] == ["1.36", "1.37"]
    master_done = t.one("create", name="master-version")
    replaces = t.all("iks POST /v2/vpc/replaceWorker")
    assert [e.detail["worker"] for e in replaces] == [WORKERS[DRA], WORKERS[DP]]  # config order, once each, never the IBM node
    assert masters[-1].seq < master_done.seq < replaces[0].seq
    # Node 2's replacement is requested only after node 1's operator readiness passed (and it really waited).
    ready1 = t.one("create", name=f"{DRA}-operator-ready")
    assert ready1.seq < t.one("create started", name=f"{DP}-replacement").seq < replaces[1].seq
    operands = [e for e in t.all("operand ready", node=dra) if e.detail["component"] != "nvidia-device-plugin-daemonset"]
    assert len(operands) == 2 and t.one("create started", name=f"{DRA}-operator-ready").seq < operands[0].seq
    assert operands[-1].seq < ready1.seq

    # The replacements report the new workers' nodes, and everything after them acted on those nodes.
    for config_name, node in ((DRA, dra), (DP, dp)):
        outs = result.outputs(f"{config_name}-replacement")
        worker = env.iks.workers[outs["new_worker_id"]]
        assert outs["old_worker_id"] == WORKERS[config_name] != outs["new_worker_id"]
        assert node == worker["networkInterfaces"][0]["ipAddress"] != config_name
        assert worker["kubeVersion"]["actual"] == "1.37.0_1499"  # the newest worker fix pack, not the master's
        assert config_name not in env.kube.nodes  # the old node left with its worker
    # The new node is recorded in state: nothing asks the user to rename the config entry.
    assert not [w for w in result.warnings() if "gpu-migration:nodes" in w]
    assert result.outputs(f"{DRA}-replacement")["node_name"] == dra

    # Labels landed on the nodes; the dra node has no device plugin and DRA devices, the other one the reverse.
    assert labels(env, dra)[PILOT_KEY] == "pilot" and labels(env, dra)[PLUGIN_OFF] == "false"
    assert PILOT_KEY not in labels(env, dp) and PLUGIN_OFF not in labels(env, dp)
    assert ER not in env.kube.nodes[dra]["status"]["allocatable"] and env.kube.nodes[dp]["status"]["allocatable"][ER]
    assert {s["spec"]["nodeName"] for s in env.kube.slices} == {dra}

    # Preflight checked the dra node; the smoke pod ran there through DRA and its verification was recorded.
    assert result.outputs("batch-1-dra-preflight")["checked_nodes"] == [dra]
    assert t.one("pod scheduled", pod=f"gpu-pilot/gpu-smoke-{DRA}").detail == {
        "pod": f"gpu-pilot/gpu-smoke-{DRA}", "node": dra, "path": "dra"}
    smoke = result.outputs(f"{DRA}-smoke-verification")
    assert smoke["result"].startswith("passed:") and smoke["gpu_uuid"] == gpu_uuid(dra)
    assert smoke["device"] == f"{DRIVER}/{dra}/gpu-0"
    record = verification(env, dra)
    assert (record["path"], record["result"], record["gpu"], record["problems"]) == ("dra", "passed", gpu_uuid(dra), [])

    # The ibm-managed node: fenced off the operator, never replaced, cordoned or touched otherwise. The fence set
    # both runbook labels; the operator then deleted deploy.driver (removeAllGPUStateLabels); only operands=false is
    # declared, so nothing drifts.
    ibm = env.kube.nodes[IBM]
    assert labels(env, IBM) == {"kubernetes.io/hostname": IBM, "nvidia.com/gpu.present": "true",
                                "nvidia.com/gpu.deploy.operands": "false"}
    assert t.one("operator removed label", node=IBM).detail["label"] == "nvidia.com/gpu.deploy.driver"
    assert "unschedulable" not in ibm["spec"] and "annotations" not in ibm["metadata"]
    assert not [p for p in env.kube.pods.values() if p["spec"].get("nodeName") == IBM]
    assert t.one("labels applied", node=IBM).seq < t.one("helm install", release="gpu-operator").seq
    assert env.iks.workers[WORKERS[IBM]]["lifecycle"]["desiredState"] == "deployed"
    ibm_writes = [e for e in t.events if e.kind.startswith("kube ") and e.detail["path"] == f"/api/v1/nodes/{IBM}"]
    assert [e.detail["body"]["metadata"]["labels"] for e in ibm_writes] == [  # the fence, the NodePatch; nothing else
        {"nvidia.com/gpu.deploy.operands": "false", "nvidia.com/gpu.deploy.driver": "false"},
        {"nvidia.com/gpu.deploy.operands": "false"}]


def test_gpu_operator_never_runs_next_to_ibm_drivers(env):
    # Nodes awaiting replacement are fenced (NodeFence) before the operator is installed.
    fresh_up(env)
    assert env.operator_conflicts == []


# 2. rollback ----------------------------------------------------------------------------------------------------

def test_rollback_of_the_dra_node(env):
    t = env.timeline
    first = fresh_up(env)
    dra, dp = new_node(first, DRA), new_node(first, DP)
    # A GPU workload runs on the dra node (through DRA) and finishes while the drain waits for it.
    training = env.kube.add_pod("ml", "training", node=dra, requests={ER: "1"},
                                extendedResourceClaimStatus={"resourceClaimName": "training-gpu", "requestMappings": []})
    env.kube.after(3, "/api/v1/pods", lambda: (training["status"].update(phase="Succeeded"),
                                              t.add("pod finished", pod="ml/training")))
    mark = t.add("second up").seq

    second = up(env, pilot_config(env, **{DRA: "device-plugin"}), API_KEY, prior=first.state)
    assert second.error is None, f"{second.error}\n{t.dump()}"
    events = [e for e in t.events if e.seq > mark]
    node_path = f"/api/v1/nodes/{dra}"

    def seq_of(predicate, what):
        found = [e for e in events if predicate(e)]
        assert len(found) == 1, f"expected one {what}, got {found}\n" + t.dump()
        return found[0].seq

    def patched(e, body_part):
        return e.kind == "kube PATCH" and e.detail["path"] == node_path and all(
            e.detail["body"].get(k) == v for k, v in body_part.items())

    cordon = seq_of(lambda e: patched(e, {"spec": {"unschedulable": True}}), "cordon")
    finished = seq_of(lambda e: e.kind == "pod finished" and e.detail["pod"] == "ml/training", "GPU pod end")
    unlabel = seq_of(lambda e: patched(e, {"metadata": {"labels": {PILOT_KEY: None}}}), "pilot label removed")
    withdrawn = seq_of(lambda e: e.kind == "slices withdrawn" and e.detail["node"] == dra, "slices withdrawn")
    plugin_on = seq_of(lambda e: patched(e, {"metadata": {"labels": {PLUGIN_OFF: "true"}}}), "device plugin on")
    check_pod = seq_of(lambda e: e.kind == "pod scheduled" and e.detail["pod"].startswith(
        f"gpu-pilot/gpu-rollback-check-{dra}-"), "rollback check pod")
    uncordon = seq_of(lambda e: patched(e, {"spec": {"unschedulable": None}}), "uncordon")
    assert cordon < finished < unlabel < withdrawn < plugin_on < check_pod < uncordon

    # The check pod got its GPU from the returning device plugin (it tolerated the cordon), and was cleaned up.
    scheduled = next(e for e in events if e.seq == check_pod)
    assert scheduled.detail["path"] == "device-plugin" and scheduled.detail["node"] == dra
    assert not [k for k in env.kube.pods if k[1].startswith("gpu-rollback-check-")]
    assert second.outputs(f"{DRA}-rollback")["gpu_uuid"] == gpu_uuid(dra)
    assert second.outputs(f"{DRA}-switch")["rolling_back"] is True
    record = verification(env, dra)
    assert (record["path"], record["result"], record["gpu"]) == ("device-plugin", "passed", gpu_uuid(dra))

    # Final state: plugin back, DRA gone from the node, uncordoned; nothing was replaced again.
    node = env.kube.nodes[dra]
    assert "unschedulable" not in node["spec"] and node["status"]["allocatable"][ER] == "1"
    assert PILOT_KEY not in labels(env, dra) and labels(env, dra)[PLUGIN_OFF] == "true"
    assert not env.kube.slices
    assert len(t.all("iks POST /v2/vpc/replaceWorker")) == 2
    # The other device-plugin node was not rolling back: never cordoned.
    assert not [e for e in events if e.kind == "kube PATCH" and e.detail["path"] == f"/api/v1/nodes/{dp}"]
    assert second.outputs(f"{DP}-switch")["rolling_back"] is False
    # The last dra node left: the DRA driver, DeviceClass and smoke test are removed after the updates.
    removed = {"dra-driver", "device-class", f"smoke-{DRA}", f"{DRA}-smoke-verification", "batch-1-dra-preflight"}
    assert removed <= {e.detail["name"] for e in events if e.kind == "delete"}
    assert min(e.seq for e in events if e.kind == "delete" and e.detail["name"] in removed) > uncordon
    assert env.dra_driver is None and not env.device_classes


# 3. failures stop the run ------------------------------------------------------------------------------------------

def test_smoke_gpu_mismatch_fails_up_naming_criterion_3(env):
    wrong = "GPU-00000000-dead-beef-0000-000000000000"
    env.smoke_log_uuid = wrong
    result = up(env, pilot_config(env), API_KEY)
    assert result.error is not None
    message = str(result.error)
    dra = new_node(result, DRA)
    assert f"smoke test gpu-pilot/gpu-smoke-{DRA} on node {dra} failed" in message
    assert "criterion 3 (GPU in logs)" in message and wrong in message and gpu_uuid(dra) in message
    assert not any(f"criterion {n}" in message for n in (1, 2, 4))
    assert f"{DRA}-smoke-verification" not in result.state
    record = verification(env, dra)
    assert record["result"] == "failed" and "criterion 3" in record["problems"][0]
    failed = env.timeline.one("failed", name=f"{DRA}-smoke-verification")
    assert not [e for e in env.timeline.events if e.seq > failed.seq and e.kind == "create started"]


def test_failed_readiness_of_node_1_stops_node_2_and_the_dra_path(env):
    env.publish_slices = False  # the DRA kubelet plugin never publishes devices on the dra node
    result = up(env, pilot_config(env, operator_ready=0.5), API_KEY)
    assert result.error is not None
    dra = new_node(result, DRA)
    message = str(result.error)
    assert f"GPU Operator on node {dra} (dra) did not pass" in message
    assert f"node {dra}: no DRA devices in ResourceSlices of driver {DRIVER}" in message
    # Node 2 is not replaced, and nothing of the DRA verification ran.
    assert [e.detail["worker"] for e in env.timeline.all("iks POST /v2/vpc/replaceWorker")] == [WORKERS[DRA]]
    assert env.iks.workers[WORKERS[DP]]["lifecycle"]["desiredState"] == "deployed"
    for name in (f"{DP}-replacement", f"{DP}-labels", "batch-1-dra-preflight", f"smoke-{DRA}", f"{DRA}-smoke-verification"):
        assert name not in result.state
        assert not env.timeline.all("register", name=name)
    assert not [k for k in env.kube.pods if k[0] == "gpu-pilot"]


# 4. the node switch, convergence and the inventory -------------------------------------------------------------------

def test_dra_node_stays_cordoned_until_its_smoke_test_passed(env):
    t = env.timeline
    result = fresh_up(env)
    dra = new_node(result, DRA)
    path = f"/api/v1/nodes/{dra}"
    writes = [e for e in t.events if e.kind == "kube PATCH" and e.detail["path"] == path]
    bodies = [e.detail["body"] for e in writes]
    cordon = next(i for i, b in enumerate(bodies) if b.get("spec") == {"unschedulable": True})
    plugin_off = next(i for i, b in enumerate(bodies) if b == {"metadata": {"labels": {PLUGIN_OFF: "false"}}})
    pilot = next(i for i, b in enumerate(bodies) if b == {"metadata": {"labels": {PILOT_KEY: "pilot"}}})
    uncordon = next(i for i, b in enumerate(bodies) if b.get("spec") == {"unschedulable": None})
    assert cordon < plugin_off < pilot < uncordon
    smoke = t.one("pod scheduled", pod=f"gpu-pilot/gpu-smoke-{DRA}")
    assert t.one("create", name=f"{DRA}-smoke-verification").seq > writes[uncordon].seq > smoke.seq
    assert "unschedulable" not in env.kube.nodes[dra]["spec"]


def test_a_second_up_changes_nothing_although_the_operator_deleted_a_label(env):
    first = fresh_up(env)
    mark = env.timeline.add("second up").seq
    second = up(env, pilot_config(env), API_KEY, prior=first.state)
    assert second.error is None, second.error
    writes = [e for e in env.timeline.events if e.seq > mark and e.kind.startswith("kube ")
              and e.detail["path"].startswith("/api/v1/nodes/")]
    assert writes == []
    assert not env.timeline.all("labels applied", node=IBM)[1:]


def test_an_unlisted_gpu_node_on_ibm_drivers_stops_up_before_the_operator(env):
    env.add_ibm_node("10.240.0.99")
    result = up(env, pilot_config(env), API_KEY)
    assert result.error is not None
    assert "GPU node 10.240.0.99 (kubelet v1.35.4+IKS" in str(result.error)
    assert "is not listed in gpu-migration:nodes: it runs IBM-managed drivers" in str(result.error)
    assert not env.timeline.all("helm install") and not env.timeline.all("iks POST /v2/vpc/replaceWorker")


def test_a_replaced_node_set_back_to_ibm_managed_is_refused(env):
    first = fresh_up(env)
    dp = new_node(first, DP)
    raw = pilot_config(env)
    for node in raw["nodes"]:
        if node["name"] == DP:
            node["name"], node["stage"] = dp, "ibm-managed"
    result = up(env, raw, API_KEY, prior=first.state)
    assert result.error is not None
    assert f"node {dp} is set to stage ibm-managed but runs kubelet v1.37" in str(result.error)
    assert labels(env, dp).get("nvidia.com/gpu.deploy.operands") != "false"


def test_operator_pods_on_an_ibm_managed_node_stop_up_naming_node_and_pods(env):
    env.operator_ignores_fence = True
    result = up(env, pilot_config(env), API_KEY)
    assert result.error is not None
    message = str(result.error)
    assert f"node {IBM}: runs IBM-managed drivers but has GPU Operator pods gpu-operator/nvidia-driver-daemonset-{IBM}" \
        in message
    # Nothing past the check: no node readiness passed, node 2 not replaced.
    replaced = [e.detail["worker"] for e in env.timeline.all("iks POST /v2/vpc/replaceWorker")]
    assert WORKERS[DP] not in replaced and WORKERS[IBM] not in replaced
    assert not env.timeline.all("create", name=f"{DRA}-operator-ready")


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
