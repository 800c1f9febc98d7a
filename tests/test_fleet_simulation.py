"""Issue 36, point 6: hundreds of seeded fleet migrations through the program's own decisions (tests/fleet_sim.py),
the invariants checked after every event; a failing seed prints its log."""
import pytest

from tests.fleet_sim import Simulation

SEEDS = range(300)


@pytest.mark.parametrize("every_batch", [False, True])
def test_seeded_fleets_keep_every_invariant_and_end_converged_or_stopped(every_batch):
    ends = {"converged": 0, "stopped": 0}
    for seed in SEEDS:
        sim = Simulation(seed, every_batch=every_batch)
        sim.run()  # raises with the seed and its log when an invariant breaks or the run does not end
        for s in sim.stacks:
            if s.converged:
                ends["converged"] += 1
                assert all(e.state == "new" for e in s.entries), sim.trace(f"{s.name} converged with nodes left")
            else:
                ends["stopped"] += 1
                assert s.failed, sim.trace(f"{s.name} stopped without a failure named")
                # Nothing it drained and never requested stays cordoned.
                assert not [e.name for e in s.entries if e.state == "cordoned"], sim.trace(f"{s.name} left cordoned")
    # The seeds cover both ends: a simulation that never stops on a stock-out, or never converges, tests little.
    assert ends["converged"] > 100 and ends["stopped"] > 10, ends


def test_without_stock_outs_or_kills_every_stack_converges():
    for seed in range(100):
        sim = Simulation(seed, kills=0, stock_outs=0)
        sim.run()
        assert all(s.converged for s in sim.stacks), sim.trace("a stack did not converge")


def test_a_stock_out_costs_one_node_per_pool_and_zone():
    """Every pool and zone out of stock from the start: each `up` loses at most its canary per pool and zone."""
    for seed in range(100):
        sim = Simulation(seed, kills=0, stock_outs=0)
        sim.stock = {(e.pool, e.zone): 0 for s in sim.stacks for e in s.entries}
        sim.run()
        lost = sum(1 for s in sim.stacks for e in s.entries if e.state == "failed")
        assert lost <= len(sim.stock), sim.trace(f"{lost} workers lost in {len(sim.stock)} pools and zones")
