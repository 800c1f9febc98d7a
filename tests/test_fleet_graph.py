"""The declared graph at fleet scale (under mocks): linear in the number of nodes, and batches in order."""
import copy
import functools
import gc
import logging
import time

import pytest

from harness import RecordingMocks, run_program, stack_config


@pytest.fixture(autouse=True)
def quiet_asyncio():
    """A failed registration under mocks leaves futures whose exception asyncio reports again on collection."""
    logger = logging.getLogger("asyncio")
    level, logger.level = logger.level, logging.CRITICAL
    yield
    gc.collect()
    logger.setLevel(level)


def fleet_config(n: int, max_unavailable: str = "1", stage: str = "device-plugin") -> dict:
    raw = copy.deepcopy(stack_config("pilot"))
    raw["nodes"] = [{"name": f"10.1.{i // 250}.{i % 250 + 1}", "workerId": f"w-{i:04d}", "stage": stage}
                    for i in range(n)]
    raw["maxUnavailable"] = max_unavailable
    return raw


def depth(dependencies: dict[str, set[str]]) -> int:
    """Longest dependency path (resources), the depth Pulumi's cycle check recurses to."""
    @functools.lru_cache(maxsize=None)
    def longest(name: str) -> int:
        return 1 + max((longest(d) for d in dependencies.get(name, ())), default=0)
    return max(longest(n) for n in dependencies)


def test_edges_grow_linearly_and_depth_stays_constant():
    runs = {n: run_program(fleet_config(n)) for n in (10, 20, 40)}
    edges = {n: sum(len(d) for d in run.dependencies.values()) for n, run in runs.items()}
    assert edges[40] - edges[20] == 2 * (edges[20] - edges[10])  # a constant number of edges per node
    # One node at a time (maxUnavailable 1), yet no chain through the nodes: depth does not grow with n.
    assert depth(runs[10].dependencies) == depth(runs[40].dependencies)
    assert len(runs[40].declared.gates) == 40


def in_flight_at_each_gate(registered, done_suffix: str = "-switch") -> list[int]:
    """For each gate, in registration order: the nodes started (gate registered) and not yet done (their last check,
    the switch of a device-plugin node, registered) when it was registered, itself included."""
    counts, started, done = [], 0, 0
    for r in registered:
        if r.name.endswith("-gate"):
            started += 1
            counts.append(started - done)
        elif r.name.endswith(done_suffix):
            done += 1
    return counts


def test_slots_follow_the_budget():
    run = run_program(fleet_config(7, max_unavailable="3"))
    gates = run.of_type("pulumi-python:dynamic/gpu-migration:CapacityGate")
    assert [g.inputs["batch"] for g in gates] == [[f"10.1.0.{i}"] for i in range(1, 8)]  # one gate per node, in order
    assert {g.inputs["min_available"] for g in gates} == {4}
    assert [g.inputs["slot"]["peers"] for g in gates[:3]] == [[], ["10.1.0.1"], ["10.1.0.1", "10.1.0.2"]]
    assert all(len(g.inputs["slot"]["peers"]) <= 2 for g in gates)  # never more than 3 in flight with it
    assert max(in_flight_at_each_gate(run.registered)) == 3
    assert [bool(g.inputs["slot"]["freed_by"]) for g in gates] == [False] * 3 + [True] * 4
    for gate in gates:
        name = gate.inputs["batch"][0]
        assert run.depends(f"{name}-replacement", f"{name}-gate")
        # The drain's re-check counts the node and the nodes in flight beside it as its gate did.
        budget = run.named(f"{name}-replacement").inputs["evict"]["budget"]
        assert budget["batch"] == [name, *gate.inputs["slot"]["peers"]]


class SlowMocks(RecordingMocks):
    """The registration of `slow` (a resource name) takes `seconds`, as a slow node's step would; the others answer
    at once (the SDK registers each resource from its own executor thread)."""

    def __init__(self, slow: str, seconds: float) -> None:
        super().__init__()
        self.slow, self.seconds = slow, seconds

    def new_resource(self, args):
        if args.name == self.slow:
            time.sleep(self.seconds)
        return super().new_resource(args)


def test_the_slowest_node_holds_only_its_own_slot():
    """2 slots, node 1 slow: nodes 3..6 each start as a slot frees, all before node 1 is done. A batch barrier would
    hold node 3 until node 1 was done."""
    mocks = SlowMocks("10.1.0.1-switch", 2.0)
    run_program(fleet_config(6, max_unavailable="2"), mocks=mocks)
    order = [r.name for r in mocks.registered]
    for later in ("10.1.0.3", "10.1.0.4", "10.1.0.5", "10.1.0.6"):
        assert order.index(f"{later}-gate") < order.index("10.1.0.1-switch"), order
    assert max(in_flight_at_each_gate(mocks.registered)) == 2


class FailingMocks(RecordingMocks):
    """The worker replacement of `failing` fails, as a refused or timed-out replacement would."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing

    def new_resource(self, args):
        if args.name == f"{self.failing}-replacement":
            raise RuntimeError(f"IKS refused the replacement of {self.failing}")
        return super().new_resource(args)


def test_a_failure_stops_the_nodes_not_yet_started():
    class Mocks(FailingMocks):  # 10.1.0.3's replacement fails while 10.1.0.4 is in flight
        def new_resource(self, args):
            if args.name == "10.1.0.4-switch":
                time.sleep(1.0)
            return super().new_resource(args)

    mocks = Mocks("10.1.0.3")
    with pytest.raises(Exception, match=r"node 10.1.0.3 did not finish \(.*IKS refused the replacement of 10.1.0.3.*\):"
                                        r" the nodes not yet started were not started"):
        run_program(fleet_config(6, max_unavailable="2"), mocks=mocks)
    names = {r.name for r in mocks.registered}
    # The node in flight beside it ran on (the engine lets in-flight operations finish; the program stops at the
    # first failed registration, so its later steps continue on the next `up`).
    assert {"10.1.0.3-gate", "10.1.0.4-gate", "10.1.0.4-replacement"} <= names
    assert not {"10.1.0.5-gate", "10.1.0.6-gate", "10.1.0.5-replacement", "10.1.0.6-replacement"} & names


def test_preview_does_not_wait_for_slots():
    """In preview every gate is registered at once (nothing runs, so nothing to wait for)."""
    run = run_program(fleet_config(3), preview=True)
    assert run.named("10.1.0.2-gate").inputs["after"] == ["10.1.0.1"]
    order = [r.name for r in run.registered]
    assert order.index("10.1.0.3-gate") < order.index("10.1.0.1-switch")


def test_preview_logs_the_plan(monkeypatch):
    import pulumi

    logged = []
    monkeypatch.setattr(pulumi.log, "info", lambda msg, *a, **k: logged.append(msg))
    run_program(fleet_config(5, max_unavailable="2"), preview=True)
    plans = [m for m in logged if m.startswith("migration plan:")]
    assert len(plans) == 1 and "5 of 5 GPU nodes, at most 2 at once" in plans[0]
    assert "start at once: 10.1.0.1, 10.1.0.2" in plans[0]
    assert "then each as a slot frees: 10.1.0.3, 10.1.0.4, 10.1.0.5" in plans[0]


def test_temporary_pool_is_surge_for_any_fleet_size():
    raw = fleet_config(6, max_unavailable="0")
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4", "zone": "us-south-1", "vpcId": "r006-vpc",
                          "subnetId": "0717-subnet", "sizePerZone": 2}
    run = run_program(raw)
    gates = run.of_type("pulumi-python:dynamic/gpu-migration:CapacityGate")
    assert max(in_flight_at_each_gate(run.registered)) == 2  # the pool's 2 workers are the slots
    assert {g.inputs["min_available"] for g in gates} == {6}  # the pool's 2 workers stand in for the nodes out
    assert run.depends("10.1.0.1-gate", "temp-gpu-pool")
