"""Batches against the IKS emulator and the real API server (tests/fleet_up.py): timelines of GPU capacity, not
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


def batches_of(run) -> list[list[str]]:
    return [g.inputs["batch"] for g in run.mocks.registered if g.name.endswith("-gate")]


def events(run, event: str, nodes) -> list[float]:
    return [c.at for c in run.timeline.changes if c.event == event and c.node in nodes]


def test_a_batch_never_exceeds_the_budget(tmp_path, kube):
    run = fleet_up(7, "2", replace_seconds=0.2, tmp_dir=tmp_path, kube=kube)
    assert run.error is None, run.error
    assert [len(b) for b in batches_of(run)] == [2, 2, 2, 1]
    assert run.timeline.max_unavailable() == 2  # used, never exceeded
    assert all(c.unavailable <= 2 for c in run.timeline.changes)
    batches = batches_of(run)
    for earlier, later in zip(batches, batches[1:]):
        new_names = {run.mocks.outputs[f"{n}-replacement"]["node_name"] for n in earlier}
        # Every node of the earlier batch is back before any node of the later one is replaced.
        assert max(events(run, "joined", new_names)) < min(events(run, "replace requested", later))
    # Nodes of one batch are replaced together, not one after the other.
    first = batches[0]
    assert max(events(run, "replace requested", first)) < min(events(run, "left", first)) + 0.2


def test_a_failure_in_one_batch_stops_later_batches(tmp_path, kube):
    run = fleet_up(6, "2", replace_seconds=0.2, tmp_dir=tmp_path, kube=kube, fail=frozenset())
    names = [n for b in batches_of(run) for n in b]
    failing = names[2]  # first node of batch 2
    run = fleet_up(6, "2", replace_seconds=0.2, tmp_dir=tmp_path, kube=kube, fail=frozenset({failing}))
    assert run.error is not None and "batch 3 and later were not started" in str(run.error)
    assert f"node {failing} of batch 2 did not finish" in str(run.error)
    requested = {c.node for c in run.timeline.changes if c.event == "replace requested"}
    assert requested == set(names[:4])  # batch 3 (names[4:]) never touched
    assert "batch-3-gate" not in {r.name for r in run.mocks.registered}
    mate = names[3]
    assert f"{mate}-replacement" in run.mocks.outputs  # the batch-mate's running replacement finished


def test_nodes_unavailable_for_other_reasons_count_against_the_budget(tmp_path, kube):
    probe = fleet_up(5, "2", replace_seconds=0.1, tmp_dir=tmp_path, kube=kube)
    last = batches_of(probe)[-1][0]  # in the last batch, so outside batches 1 and 2
    run = fleet_up(5, "2", replace_seconds=0.1, tmp_dir=tmp_path, kube=kube, cordoned=(last,), capacity_timeout=0.5)
    assert run.error is not None and "batch 1 was not started" in str(run.error)
    assert f"unavailable: {last} (cordoned)" in str(run.error)
    assert not [c for c in run.timeline.changes if c.event == "replace requested"]


def test_a_gate_waits_for_capacity_to_come_back(tmp_path, kube, monkeypatch):
    probe = fleet_up(5, "2", replace_seconds=0.1, tmp_dir=tmp_path, kube=kube)
    last = batches_of(probe)[-1][0]
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


def test_batch_mates_in_one_pool_and_zone_each_follow_their_own_new_worker(tmp_path, kube):
    # IKS links no new worker to the one it replaces: both replacements of a batch see both new workers appear.
    # Each new worker takes 1.5 s: a batch-mate's drain and request, which start together, must land within that
    # even on a loaded machine (with 0.2 s one mate's new worker once joined before the other's old one left).
    run = fleet_up(4, "2", replace_seconds=1.5, tmp_dir=tmp_path, kube=kube, shared_pool=True)
    assert run.error is None, run.error
    batches = batches_of(run)
    assert [len(b) for b in batches] == [2, 2]
    first = batches[0]
    # The batch-mates really ran together: both requests before either new worker joined.
    joined = events(run, "joined", {run.mocks.outputs[f"{n}-replacement"]["node_name"] for n in first})
    assert max(events(run, "replace requested", first)) < min(joined)
    new_ids = [run.mocks.outputs[f"{n}-replacement"]["new_worker_id"] for b in batches for n in b]
    assert len(set(new_ids)) == 4  # no new worker followed twice
    old_ids = {run.mocks.outputs[f"{n}-replacement"]["old_worker_id"] for b in batches for n in b}
    assert not old_ids & set(new_ids) and run.iks.count("POST", "/v2/vpc/replaceWorker") == 4
    assert run.timeline.max_unavailable() == 2
