"""Slots against the IKS emulator and the real API server (tests/fleet_up.py): timelines of GPU capacity, not
sleeps."""
import gc
import logging

import pytest

from fleet_up import fleet_up


@pytest.fixture(autouse=True)
def quiet_asyncio():
    """A failed registration under mocks leaves futures whose exception asyncio reports again on collection."""
    logger = logging.getLogger("asyncio")
    level, logger.level = logger.level, logging.CRITICAL
    yield
    gc.collect()
    logger.setLevel(level)


def order_of(run) -> list[str]:
    """The nodes in the order their gates were registered (one gate per node)."""
    return [g.inputs["batch"][0] for g in run.mocks.registered if g.name.endswith("-gate")]


def events(run, event: str, nodes) -> list[float]:
    return [c.at for c in run.timeline.changes if c.event == event and c.node in nodes]


def test_never_more_than_the_budget_out_and_a_slot_frees_per_node(tmp_path, kube):
    run = fleet_up(7, "2", replace_seconds=0.2, tmp_dir=tmp_path, kube=kube)
    assert run.error is None, run.error
    order = order_of(run)
    assert len(order) == 7
    assert run.timeline.max_unavailable() == 2  # used, never exceeded
    assert all(c.unavailable <= 2 for c in run.timeline.changes)
    # Each node from the third on starts once an earlier node is back (its slot), not once a whole batch is.
    for i, node in enumerate(order[2:], start=2):
        back = sorted(events(run, "joined", {run.mocks.outputs[f"{n}-replacement"]["node_name"]
                                             for n in order[:i]}))
        assert len([t for t in back if t < min(events(run, "replace requested", [node]))]) >= i - 1, node
    # The first two are replaced together, not one after the other.
    first = order[:2]
    assert max(events(run, "replace requested", first)) < min(events(run, "left", first)) + 0.2


def test_a_failure_stops_the_nodes_not_yet_started(tmp_path, kube):
    run = fleet_up(6, "2", replace_seconds=0.2, tmp_dir=tmp_path, kube=kube, fail=frozenset())
    names = order_of(run)
    failing = names[2]
    run = fleet_up(6, "2", replace_seconds=0.2, tmp_dir=tmp_path, kube=kube, fail=frozenset({failing}))
    assert run.error is not None and f"node {failing} did not finish" in str(run.error)
    assert "the nodes not yet started were not started" in str(run.error)
    requested = {c.node for c in run.timeline.changes if c.event == "replace requested"}
    started = {g.inputs["batch"][0] for g in run.mocks.registered if g.name.endswith("-gate")}
    assert requested <= started
    # At most one node started beside the failing one (2 slots); the rest were never touched.
    assert len(started - set(names[:2])) <= 2 and len(started) <= 4
    assert not set(names[5:]) & requested


def test_nodes_unavailable_for_other_reasons_count_against_the_budget(tmp_path, kube):
    """2 slots, one GPU node cordoned by someone else (it takes one unit of the budget, as Karpenter's allowed
    disruptions are the budget minus the NotReady nodes): the nodes go one at a time, never two out beside it. Each
    node's gate and drain count the node that was in flight beside it when its slot came as out only until that node
    finished (kube/finished.py); counted out for good, the next gate would wait for capacity that never comes."""
    probe = fleet_up(5, "2", replace_seconds=0.1, tmp_dir=tmp_path, kube=kube)
    last = order_of(probe)[-1]  # the last to start, so outside the first two slots
    run = fleet_up(5, "2", replace_seconds=0.1, tmp_dir=tmp_path, kube=kube, cordoned=(last,), capacity_timeout=20)
    assert run.error is None, run.error
    requested = {c.node for c in run.timeline.changes if c.event == "replace requested"}
    assert len(requested) == 5, requested  # the cordoned node too, in its turn (it is configured)
    # Out at every moment: the workers IKS has out, and the cordoned node until its own replacement took it.
    taken = min(c.at for c in run.timeline.changes if c.event == "replace requested" and c.node == last)
    out = [c.unavailable + (c.at < taken) for c in run.timeline.changes]
    assert max(out) == 2, out  # used, never exceeded


def test_a_gate_waits_for_capacity_to_come_back(tmp_path, kube, monkeypatch):
    probe = fleet_up(5, "2", replace_seconds=0.1, tmp_dir=tmp_path, kube=kube)
    last = order_of(probe)[-1]
    uncordoned = []

    def uncordon_while_the_first_gate_polls(kube):
        from iks_gpu_migration import plan

        def uncordon():
            kube.patch_node(last, {"spec": {"unschedulable": None}})
            uncordoned.append(last)
        kube.after_calls(monkeypatch, plan, "gate_decision", 5, uncordon)

    run = fleet_up(5, "2", replace_seconds=0.1, tmp_dir=tmp_path, kube=kube, cordoned=(last,),
                   setup=uncordon_while_the_first_gate_polls)
    assert run.error is None and uncordoned
    gate_opened = next(c.at for c in run.timeline.changes if c.event == "gate opened")
    assert not [c for c in run.timeline.changes if c.event == "replace requested" and c.at < gate_opened]
    assert run.timeline.max_unavailable() <= 2


def test_nodes_in_one_pool_and_zone_each_follow_their_own_new_worker(tmp_path, kube):
    # IKS links no new worker to the one it replaces: two replacements in flight together see both new workers
    # appear. Each new worker takes 1.5 s: the second node's drain and request, which start with the first's, must
    # land within that even on a loaded machine.
    run = fleet_up(4, "2", replace_seconds=1.5, tmp_dir=tmp_path, kube=kube, shared_pool=True)
    assert run.error is None, run.error
    order = order_of(run)
    assert len(order) == 4
    first = order[:2]
    # The first two really ran together: both requests before either new worker joined.
    joined = events(run, "joined", {run.mocks.outputs[f"{n}-replacement"]["node_name"] for n in first})
    assert max(events(run, "replace requested", first)) < min(joined)
    new_ids = [run.mocks.outputs[f"{n}-replacement"]["new_worker_id"] for n in order]
    assert len(set(new_ids)) == 4  # no new worker followed twice
    old_ids = {run.mocks.outputs[f"{n}-replacement"]["old_worker_id"] for n in order}
    assert not old_ids & set(new_ids) and run.iks.count("POST", "/v2/vpc/replaceWorker") == 4
    assert run.timeline.max_unavailable() == 2
