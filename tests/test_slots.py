"""plan/slots.py: which node starts when (a slot per node), a failure, nodes left out by an earlier `up`."""
from iks_gpu_migration.plan.slots import Slots, resume_order


def started(starts) -> list[str]:
    return [s.node for s in starts]


def test_a_node_starts_as_soon_as_a_slot_frees_in_config_order():
    slots = Slots(list("abcde"), 2)
    assert started(slots.starts()) == ["a", "b"]
    assert started(slots.finish("b")) == ["c"]  # b's slot, not the batch of a and b
    nxt = slots.finish("c")
    assert [(s.node, s.peers, s.freed_by) for s in nxt] == [("d", ("a",), "c")]
    assert slots.in_flight == ("a", "d") and slots.waiting == ("e",)


def test_a_failure_stops_the_nodes_not_yet_started_and_the_nodes_in_flight_finish():
    slots = Slots(list("abcd"), 2)
    slots.starts()
    assert slots.fail("a", "boom") == [] and slots.stopped == "node a did not finish (boom)"
    assert slots.never_started == ("c", "d") and not slots.finished()  # b still in flight
    assert slots.finish("b") == [] and slots.finished()


def test_nodes_an_earlier_up_left_out_come_first_and_still_start_after_a_stop():
    assert resume_order(list("abcde"), {"d", "b"}) == ["b", "d", "a", "c", "e"]
    assert started(Slots(list("abcde"), 1, resumed=frozenset({"e"})).starts()) == ["e"]
    slots = Slots(list("abcde"), 1, resumed=frozenset({"a", "e"}))
    slots.starts()
    assert started(slots.fail("a", "again")) == ["e"]  # stopped, but e is out already: it takes the slot
    assert slots.finish("e") == [] and slots.finished() and slots.never_started == ("b", "c", "d")
