"""Issue 17 point 4: right before each node's drain inside its replacement the capacity budget is checked again,
counting only what is unavailable beyond the admitted batch; bounded, and skipped once the replace was requested.
Against the real API server (tests/envtest.py) and the IKS emulator, driven like tests/test_node_eviction.py."""
import pytest

from iks_gpu_migration import plan
from iks_gpu_migration.common.waiting import WaitTimeout
from iks_gpu_migration.kube.drain_budget import BudgetExceeded
from tests.emulators.iks import IksEmulator
from tests.test_iks_providers import replace

IKS_GPU = {"ibm-cloud.kubernetes.io/gpu-enabled": "true", "ibm-cloud.kubernetes.io/machine-type": "gx3.16x80.l4"}


@pytest.fixture
def env(kube):
    """Worker w1 is node NODE of batch [NODE, MATE]; o1, o2 are GPU nodes outside the batch (IKS's labels only: IBM's
    drivers); the budget needs both."""
    node, mate, o1, o2 = (kube.name(n) for n in ("10.240.0.21", "10.240.0.22", "o1", "o2"))
    iks_emu = IksEmulator(master_version="1.36.1_1530").start()
    iks_emu.add_worker(worker_id="w1")["networkInterfaces"][0]["ipAddress"] = node
    for name in (node, mate, o1, o2):
        kube.add_node(name, labels=IKS_GPU, allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")
    kube.add_node(kube.name("cpu-1"), labels={"ibm-cloud.kubernetes.io/machine-type": "bx2.4x16"})
    evict = {"kubeconfig": kube.kubeconfig, "timeout": 5, "poll_interval": 0.01,
             "budget": {"index": 1, "batch": [node, mate], "selector": plan.DEFAULT_GPU_NODE_SELECTOR,
                        "min_available": 2, "timeout": 5, "poll_interval": 0.01}}
    yield iks_emu, kube, evict, node, mate, o1, o2
    iks_emu.stop()


def test_batch_mates_out_by_admission_do_not_hold_the_drain(env, monkeypatch):
    iks_emu, kube, evict, node, mate, _, _ = env
    kube.cordon(mate)  # its own drain, in parallel
    kube.set_ready(mate, False)
    polls = kube.after_calls(monkeypatch, plan, "drain_decision", 1, lambda: None)
    replace(iks_emu, "w1", evict=evict)
    assert len(polls) == 1 and kube.unschedulable(node)  # open at the first look, then drained
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_a_node_lost_after_the_gate_holds_the_drain_until_it_is_back(env, monkeypatch):
    iks_emu, kube, evict, node, _, _, o2 = env
    kube.cordon(o2)  # e.g. maintenance started after the batch's gate opened
    drained_while_held: list[bool] = []

    def repaired():
        drained_while_held.append(kube.unschedulable(node))
        kube.patch_node(o2, {"spec": {"unschedulable": False}})
    polls = kube.after_calls(monkeypatch, plan, "drain_decision", 3, repaired)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "0" * 8, "controller": True}
    kube.add_pod(kube.ns("ml"), "training", node=node, owner=owner)  # a controller re-creates it: drained
    replace(iks_emu, "w1", evict=evict)
    assert drained_while_held == [False] and len(polls) == 4  # waited, untouched, then drained once o2 was back
    assert kube.pod_or_none(kube.ns("ml"), "training") is None  # evicted before the replace
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_the_wait_is_bounded_and_names_the_unavailable_nodes(env):
    iks_emu, kube, evict, node, mate, o1, o2 = env
    kube.set_ready(o1, False)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "0" * 8, "controller": True}
    kube.add_pod(kube.ns("ml"), "training", node=node, owner=owner)  # a controller re-creates it: drained
    with pytest.raises(BudgetExceeded) as raised:
        replace(iks_emu, "w1", evict={**evict, "budget": {**evict["budget"], "timeout": 0.3}})
    message = str(raised.value)
    assert f"waiting for capacity to drain node {node} beside {mate} in flight" in message
    assert f"1 GPU nodes available outside the batch, 2 needed; unavailable: {o1} (NotReady)" in message
    assert f"node {node} was not drained and its worker not replaced" in message
    assert "gpu-migration:maxUnavailable" in message and "`pulumi up` again" in message
    assert not kube.unschedulable(node)
    assert kube.pod(kube.ns("ml"), "training")["metadata"].get("deletionTimestamp") is None
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0


def test_a_resumed_replacement_that_already_asked_iks_does_not_wait_for_the_budget(env):
    iks_emu, kube, evict, node, _, o1, o2 = env
    iks_emu.stick_new_workers = True
    with pytest.raises(WaitTimeout):  # an `up` interrupted after its replaceWorker: the new worker is provisioning
        replace(iks_emu, "w1", evict=evict, timeout=0.3)
    kube.cordon(o1)  # the budget is short now: a new drain would wait
    kube.set_ready(o2, False)
    iks_emu.stuck.clear()
    outs = replace(iks_emu, "w1", evict=evict)  # the next `up`: the node is out already, nothing to hold
    assert outs["old_worker_id"] == "w1" and outs["new_worker_id"] != "w1"
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_a_replacement_without_a_budget_drains_as_before(env):
    iks_emu, kube, evict, node, _, o1, o2 = env
    kube.cordon(o1)
    kube.cordon(o2)
    replace(iks_emu, "w1", evict={k: v for k, v in evict.items() if k != "budget"})
    assert kube.unschedulable(node) and iks_emu.count("POST", "/v2/vpc/replaceWorker") == 1
