"""Which new worker a resumed replacement follows when several entries of one pool and zone wait for one (e.g. `up`
killed right after both batch-mates' replaceWorker calls): a pure decision, the same for every replacement that makes
it on its own, and no two entries ever take the same worker."""
import itertools

import pytest

from iks_gpu_migration.iks.claims import find_replacement, pair_new_workers, waiting_entries
from iks_gpu_migration.iks.provider import ReplacementError

TARGET = "1.37"
POOL = {"zones": [{"id": "z1", "workerCount": 3}]}


def worker(wid: str, state: str = "deployed", version: str = "1.35.4_1540", zone: str = "z1") -> dict:
    desired = "deleted" if state in ("deleting", "deleted") else "deployed"
    return {"id": wid, "poolID": "gpu", "location": zone, "kubeVersion": {"actual": version},
            "lifecycle": {"actualState": state, "desiredState": desired}}


def new(wid: str, state: str = "provisioning") -> dict:
    return worker(wid, state, "1.37.0_1600" if state == "deployed" else "")


# Entries a, b, c (config name -> configured worker): a and b of one batch were replaced, c keeps its old worker.
ENTRIES = {"a": "w-a", "b": "w-b", "c": "w-c"}
BATCH = [worker("w-a", "deleted"), worker("w-b", "deleting"), worker("w-c"), new("w-9"), new("w-5", "deployed")]


def follow(entry: str, workers: list[dict], entries=ENTRIES, recorded=None, busy=frozenset()) -> list[dict]:
    """What the resumed replacement of `entry` decides on this worker list (replacement._Run._follow, minus I/O)."""
    recorded = recorded or {}
    old = next(w for w in workers if w["id"] == entries[entry])
    live = {w["id"] for w in workers if w["lifecycle"]["actualState"] not in ("deleting", "deleted")}
    waiting = waiting_entries(old, workers, entry, entries, {e for w, e in recorded.items() if w in live}, busy)
    return find_replacement(old, workers, POOL, TARGET, None, frozenset(recorded), waiting, entry,
                            frozenset(w for e, w in entries.items() if e != entry))


def test_pairing_sorts_both_sides_and_pairs_in_order():
    assert pair_new_workers(["b", "a"], ["w-9", "w-5"]) == {"a": "w-5", "b": "w-9"}
    assert pair_new_workers(["a"], ["w-5"]) == {"a": "w-5"}


@pytest.mark.parametrize("waiting, news", [
    (["a", "b"], ["w-5"]), (["a"], ["w-5", "w-9"]), (["a", "a"], ["w-5", "w-9"]), (["a", "b"], ["w-5", "w-5"]),
    ([], []),
])
def test_no_pairing_unless_every_waiting_entry_meets_exactly_one_new_worker(waiting, news):
    assert pair_new_workers(waiting, news) == {}


def test_batch_mates_resumed_on_their_own_take_different_workers_whatever_the_listing_order():
    for order in itertools.permutations(BATCH):
        taken = {e: [w["id"] for w in follow(e, list(order))] for e in ("a", "b")}
        assert taken == {"a": ["w-5"], "b": ["w-9"]}, order


def test_a_worker_another_entry_recorded_is_taken_and_its_entry_no_longer_waits():
    # b's new node carries b (its readiness step, or the replacement that finished before the kill).
    assert [w["id"] for w in follow("a", BATCH, recorded={"w-5": "b"})] == ["w-9"]
    # A node of a deleted worker that still carries b resolves nothing: b still waits, a's pairing is unchanged.
    gone = [*BATCH, worker("w-3", "deleted", "1.37.0_1600")]
    assert [w["id"] for w in follow("a", gone, recorded={"w-3": "b"})] == ["w-5"]


def test_a_batch_mate_this_process_already_handles_is_not_waiting():
    # b claimed w-5 in this provider process (NewWorkerClaims): w-5 is no candidate (others) and b not waiting.
    old = BATCH[0]
    waiting = waiting_entries(old, BATCH, "a", ENTRIES, set(), busy=frozenset({"w-b"}))
    assert waiting == ["a"]
    assert [w["id"] for w in find_replacement(old, BATCH, POOL, TARGET, None, frozenset({"w-5"}), waiting, "a",
                                              frozenset({"w-b", "w-c"}))] == ["w-9"]


def test_another_entrys_own_worker_at_the_target_is_never_new():
    migrated = [worker("w-a", "deleted"), worker("w-c", version="1.37.0_1600"), new("w-9", "deployed"),
                worker("w-d")]
    entries = {"a": "w-a", "c": "w-c", "d": "w-d"}  # c's worker is already at the target, never replaced
    assert [w["id"] for w in follow("a", migrated, entries)] == ["w-9"]
    with pytest.raises(ReplacementError, match=r"ambiguous \(w-c, w-9:"):
        follow("a", migrated, {"a": "w-a"})  # not knowing c's worker: two candidates, no guess


def test_waits_while_not_every_new_worker_is_there():
    early = [worker("w-a", "deleted"), worker("w-b", "deleting"), worker("w-c"), new("w-5")]
    assert follow("a", early) == [] and follow("b", early) == []  # zone not back to its size
    small = {"zones": [{"id": "z1", "workerCount": 2}]}  # e.g. the pool's size was lowered: gate passed, one short
    old = early[0]
    waiting = waiting_entries(old, early, "a", ENTRIES, set())
    assert sorted(waiting) == ["a", "b"]
    assert find_replacement(old, early, small, TARGET, None, frozenset(), waiting, "a", frozenset({"w-b", "w-c"})) == []


def test_a_failed_new_worker_is_returned_when_the_pairing_cannot_be_made():
    failed = [worker("w-a", "deleted"), worker("w-b", "deleted"), worker("w-c"), new("w-5"),
              worker("w-9", "provision_failed", "")]
    assert [w["id"] for w in follow("a", failed)] == ["w-9"]  # the caller stops naming it with IKS's message


def test_an_unexplained_extra_new_worker_is_ambiguous():
    extra = [*BATCH, new("w-7")]
    big = {"zones": [{"id": "z1", "workerCount": 4}]}
    old = extra[0]
    waiting = waiting_entries(old, extra, "a", ENTRIES, set())
    with pytest.raises(ReplacementError, match="ambiguous"):
        find_replacement(old, extra, big, TARGET, None, frozenset(), waiting, "a", frozenset({"w-b", "w-c"}))


def test_after_an_earlier_migration_an_entry_waits_on_the_worker_its_node_records():
    """A kubeVersion bump killed after both requests, on IKS that no longer lists the first migration's deleted
    workers: the batch-mates' current workers come from their nodes' records, so both still pair."""
    from iks_gpu_migration.iks.claims import current_workers
    bump = [worker("n-a", "deleting", "1.37.0_1600"), worker("n-b", "deleted", "1.37.0_1600"),
            worker("w-c"), new("w-7"), new("w-3")]
    recorded = {"n-a": "a", "n-b": "b"}  # the nodes of a's and b's first replacement, still there
    current = current_workers(ENTRIES, recorded, bump)
    assert current == {"a": "n-a", "b": "n-b", "c": "w-c"}
    target_bump = {"zones": [{"id": "z1", "workerCount": 3}]}
    picks = {}
    for entry in ("a", "b"):
        old = next(w for w in bump if w["id"] == current[entry])
        waiting = waiting_entries(old, bump, entry, current, set())
        got = find_replacement(old, bump, target_bump, "1.38", None, frozenset(), waiting, entry,
                               frozenset(w for e, w in current.items() if e != entry))
        picks[entry] = [w["id"] for w in got]
    assert picks == {"a": ["w-3"], "b": ["w-7"]}
    # Without the records only the configured workers count: IKS no longer lists them, nobody else waits.
    assert current_workers(ENTRIES, {}, bump) == ENTRIES
