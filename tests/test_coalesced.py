"""Reads a batch's nodes ask for at once, made once (common/coalesced.py): a caller gets a read that started after it
asked, never one already under way; callers that overlap share one; an error reaches every sharer."""
import threading
import time

import pytest

from iks_gpu_migration.common.coalesced import Coalesced


def test_callers_at_once_share_one_read_that_started_after_each_asked():
    reads, gate = [], threading.Event()
    shared = Coalesced()

    def read():
        reads.append(time.monotonic())
        gate.wait(5)
        return len(reads)

    results = {}
    first = threading.Thread(target=lambda: results.__setitem__("first", shared.call("k", read)))
    first.start()
    while not reads:
        time.sleep(0.005)
    asked_at = time.monotonic()
    # Eight callers arrive while read 1 runs: read 1 started before they asked, so they all share read 2.
    late = [threading.Thread(target=lambda i=i: results.__setitem__(i, shared.call("k", read))) for i in range(8)]
    for t in late:
        t.start()
    time.sleep(0.1)
    gate.set()
    for t in [first, *late]:
        t.join(5)
    assert results["first"] == 1
    assert {results[i] for i in range(8)} == {2}
    assert len(reads) == 2 and reads[1] > asked_at
    assert shared.call("k", lambda: "fresh") == "fresh"  # nothing running: a caller alone reads at once
    assert shared.call("other", lambda: "other") == "other"  # keys are apart


def test_an_error_reaches_every_caller_that_shared_the_read_and_the_next_caller_reads_again():
    shared, started, gate = Coalesced(), threading.Event(), threading.Event()

    def failing():
        started.set()
        gate.wait(5)
        raise RuntimeError("API server gone")

    errors = []

    def caller():
        try:
            shared.call("k", failing)
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=caller) for _ in range(3)]
    threads[0].start()
    started.wait(5)
    for t in threads[1:]:
        t.start()
    time.sleep(0.05)
    gate.set()
    for t in threads:
        t.join(5)
    assert errors == ["API server gone"] * 3
    with pytest.raises(RuntimeError):
        shared.call("k", failing)  # an error is not kept: the next caller reads again (and fails again here)
    assert shared.call("k", lambda: 7) == 7
