"""The declared graph at fleet scale (under mocks): linear in the number of nodes, and batches in order."""
import copy
import functools
import gc
import logging

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


def test_batches_follow_the_budget():
    run = run_program(fleet_config(7, max_unavailable="3"))
    gates = run.of_type("pulumi-python:dynamic/gpu-migration:CapacityGate")
    assert [g.inputs["batch"] for g in gates] == [
        ["10.1.0.1", "10.1.0.2", "10.1.0.3"], ["10.1.0.4", "10.1.0.5", "10.1.0.6"], ["10.1.0.7"]]
    assert gates[1].inputs["after"] == gates[0].inputs["batch"] and gates[0].inputs["min_available"] == 4
    order = [r.name for r in run.registered]
    for name in gates[0].inputs["batch"]:
        assert run.depends(f"{name}-replacement", "batch-1-gate")
        assert order.index(f"{name}-switch") < order.index("batch-2-gate")


class FailingMocks(RecordingMocks):
    """The worker replacement of `failing` fails, as a refused or timed-out replacement would."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing

    def new_resource(self, args):
        if args.name == f"{self.failing}-replacement":
            raise RuntimeError(f"IKS refused the replacement of {self.failing}")
        return super().new_resource(args)


def test_a_failure_stops_later_batches():
    mocks = FailingMocks("10.1.0.3")  # batch 2 of 2-node batches
    with pytest.raises(Exception, match=r"batch 3 and later were not started: node 10.1.0.3 of batch 2 did not finish"):
        run_program(fleet_config(6, max_unavailable="2"), mocks=mocks)
    names = {r.name for r in mocks.registered}
    # Its batch-mate ran alongside it (the engine lets in-flight operations finish; the program stops at the first
    # failed registration, so the mate's later steps continue on the next `up`).
    assert {"batch-1-gate", "batch-2-gate", "10.1.0.4-replacement"} <= names
    assert "batch-3-gate" not in names
    assert not {"10.1.0.5-replacement", "10.1.0.6-replacement"} & names


def test_preview_does_not_wait_for_batches():
    """In preview the next gate takes the plan's names at once (nothing runs, so nothing to wait for)."""
    run = run_program(fleet_config(3), preview=True)
    assert run.named("batch-2-gate").inputs["after"] == ["10.1.0.1"]
    order = [r.name for r in run.registered]
    assert order.index("batch-3-gate") < order.index("10.1.0.1-switch")


def test_preview_logs_the_plan(monkeypatch):
    import pulumi

    logged = []
    monkeypatch.setattr(pulumi.log, "info", lambda msg, *a, **k: logged.append(msg))
    run_program(fleet_config(5, max_unavailable="2"), preview=True)
    plans = [m for m in logged if m.startswith("migration plan:")]
    assert len(plans) == 1 and "5 of 5 GPU nodes in 3 batch(es) of at most 2" in plans[0]
    assert "batch 3: 10.1.0.5" in plans[0]


def test_temporary_pool_is_surge_for_any_fleet_size():
    raw = fleet_config(6, max_unavailable="0")
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4", "zone": "us-south-1", "vpcId": "r006-vpc",
                          "subnetId": "0717-subnet", "sizePerZone": 2}
    run = run_program(raw)
    gates = run.of_type("pulumi-python:dynamic/gpu-migration:CapacityGate")
    assert [len(g.inputs["batch"]) for g in gates] == [2, 2, 2]
    assert {g.inputs["min_available"] for g in gates} == {6}  # the pool's 2 workers stand in for the batch
    assert run.depends("batch-1-gate", "temp-gpu-pool")
