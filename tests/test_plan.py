"""The pure plan: budget, batches, gate decisions; and the config keys that feed it."""
import copy

import pytest

from harness import stack_config
from iks_gpu_migration import config
from iks_gpu_migration.config import ConfigError, Node
from iks_gpu_migration.plan import DEFAULT_GPU_NODE_SELECTOR, NodeView, PlanError, drain_decision, gate_decision, \
    make_plan, plan_for, resolve_max_unavailable

GPU = {"nvidia.com/gpu.present": "true"}
SELECTOR = "nvidia.com/gpu.present=true"


def nodes(*stages: str) -> list[Node]:
    return [Node(name=f"10.0.0.{i}", worker_id=f"w{i}", stage=s) for i, s in enumerate(stages, 1)]


@pytest.mark.parametrize("spec, fleet, surge, expected", [
    (1, 10, 0, 1), ("3", 10, 0, 3), ("25%", 10, 0, 2),  # percent rounds down (ResolveFenceposts)
    ("5%", 10, 0, 1),  # rounds to 0: still one at a time
    ("5%", 10, 2, 0), (0, 10, 1, 0),  # surge alone may carry the batches
    (50, 10, 0, 10), ("100%", 4, 0, 4),
])
def test_max_unavailable_resolves_to_a_count(spec, fleet, surge, expected):
    assert resolve_max_unavailable(spec, fleet, surge) == expected


def test_zero_budget_without_surge_is_refused():
    with pytest.raises(PlanError, match="maxUnavailable is 0 but there is no surge"):
        resolve_max_unavailable(0, 10)


def test_turns_in_config_order_with_budget_plus_surge_slots():
    plan = make_plan(nodes("dra", "ibm-managed", "device-plugin", "device-plugin", "dra", "device-plugin"),
                     max_unavailable=2, surge=1, soak_seconds=300, surge_pool="tmp")
    assert [t.nodes for t in plan.batches] == [("10.0.0.1",), ("10.0.0.3",), ("10.0.0.4",), ("10.0.0.5",),
                                              ("10.0.0.6",)]
    assert plan.slots == 3 and plan.untouched == ("10.0.0.2",)
    assert [t.after for t in plan.batches] == [(), ("10.0.0.1",), ("10.0.0.3",), ("10.0.0.4",), ("10.0.0.5",)]
    assert [t.soak_seconds for t in plan.batches] == [0, 0, 0, 300, 300]  # soak only where a node's end freed a slot
    assert [t.round for t in plan.batches] == [1, 1, 1, 2, 2]
    assert plan.budget.min_available == 6 - 2  # the surge keeps capacity while 3 are out
    assert plan.batch_of("10.0.0.5").index == 4 and plan.batch_of("10.0.0.2") is None
    assert plan.batches[0].gate_name == "10.0.0.1-gate"
    text = plan.render()
    assert ("5 of 6 GPU nodes, at most 3 at once (maxUnavailable 2 + surge 1 from temporary GPU pool tmp)" in text)
    assert "300s of soak" in text and ">= 4 available GPU nodes" in text
    assert "start at once: 10.0.0.1, 10.0.0.3, 10.0.0.4" in text
    assert "then each as a slot frees: 10.0.0.5, 10.0.0.6" in text and "not replaced (ibm-managed): 10.0.0.2" in text


def test_default_budget_is_one_node_at_a_time():
    plan = make_plan(nodes("dra", "device-plugin", "dra"))
    assert [b.nodes for b in plan.batches] == [("10.0.0.1",), ("10.0.0.2",), ("10.0.0.3",)] and plan.slots == 1


def test_plan_of_a_large_fleet_never_exceeds_its_budget():
    plan = make_plan(nodes(*["device-plugin"] * 1000), max_unavailable="3%")
    assert plan.slots == 30 and len(plan.batches) == 1000
    assert [t.node for t in plan.batches] == [n.name for n in nodes(*["device-plugin"] * 1000)]


# Gate decisions -------------------------------------------------------------------------------------------------

def fleet(n: int, **states) -> list[NodeView]:
    return [NodeView(f"n{i}", GPU, **states.get(f"n{i}", {})) for i in range(1, n + 1)]


def test_gate_opens_when_the_batch_fits():
    decision = gate_decision(fleet(5), ["n1", "n2"], SELECTOR, min_available=3)
    assert decision.open and decision.available == ("n3", "n4", "n5")


@pytest.mark.parametrize("state, why", [({"unschedulable": True}, "cordoned"), ({"ready": False}, "NotReady")])
def test_nodes_unavailable_for_other_reasons_count_against_the_budget(state, why):
    decision = gate_decision(fleet(5, n4=state), ["n1", "n2"], SELECTOR, min_available=3)
    assert not decision.open
    assert decision.unavailable == (f"n4 ({why})",)
    assert "2 GPU nodes available outside the batch, 3 needed; unavailable: n4" in decision.state


def test_a_missing_gpu_node_is_not_available():
    decision = gate_decision([v for v in fleet(5) if v.name != "n5"], ["n1", "n2"], SELECTOR, min_available=3)
    assert not decision.open


def test_batch_nodes_themselves_do_not_count_twice():
    # A batch node already cordoned (e.g. an interrupted run) is part of the batch, not of the rest.
    decision = gate_decision(fleet(5, n1={"unschedulable": True}), ["n1", "n2"], SELECTOR, min_available=3)
    assert decision.open and decision.unavailable == ()


def test_surge_and_non_gpu_nodes():
    views = fleet(4) + [NodeView("tmp-1", GPU), NodeView("cpu-1", {"role": "cpu"})]
    # Batch of 2 with budget 1 and a surge worker: the pool worker keeps capacity at 4 - 1.
    assert gate_decision(views, ["n1", "n2"], SELECTOR, min_available=3).open
    assert not gate_decision(views[:4] + views[5:], ["n1", "n2"], SELECTOR, min_available=3).open  # pool not there


# Config -----------------------------------------------------------------------------------------------------------

def pilot(**overrides):
    raw = copy.deepcopy(stack_config("pilot"))
    raw.update(overrides)
    return raw


def test_budget_keys_default_to_todays_behaviour():
    cfg = config.parse(pilot())
    assert (cfg.max_unavailable, cfg.batch_soak_seconds, cfg.surge) == (1, 0, 0)
    assert cfg.gpu_node_selector == DEFAULT_GPU_NODE_SELECTOR and cfg.timeouts.capacity_gate == 3600


def test_budget_keys_parse_as_pulumi_passes_them():
    cfg = config.parse(pilot(maxUnavailable="2", batchSoakSeconds="60"))  # scalars arrive as strings
    assert (cfg.max_unavailable, cfg.batch_soak_seconds) == (2, 60)
    assert config.parse(pilot(maxUnavailable="25%")).max_unavailable == "25%"


@pytest.mark.parametrize("value, message", [
    ("two", "gpu-migration:maxUnavailable: maxUnavailable 'two' must be a node count"),
    ("150%", "maxUnavailable '150%' must be a node count"),
    ("0", "maxUnavailable is 0 but there is no surge capacity"),
])
def test_bad_budget_is_named(value, message):
    with pytest.raises(ConfigError, match=message):
        config.parse(pilot(maxUnavailable=value))


def test_bad_selector_is_named():
    with pytest.raises(ConfigError, match="gpu-migration:gpuNodeSelector: gpuNodeSelector term 'gpu' must be key=value"):
        config.parse(pilot(gpuNodeSelector="gpu"))


def test_status_explains_the_plan():
    from iks_gpu_migration.cli import status

    text = status.plan_text({"nodes": [{"name": f"n{i}", "workerId": f"w{i}", "stage": "device-plugin"}
                                       for i in range(1, 6)], "maxUnavailable": "40%"})
    assert "5 of 5 GPU nodes, at most 2 at once (maxUnavailable 2)" in text
    assert "start at once: n1, n2" in text and "then each as a slot frees: n3, n4, n5" in text
    assert status.plan_text({"nodes": [], "maxUnavailable": "x"}).startswith("no migration plan: maxUnavailable 'x'")


def test_status_says_which_nodes_hold_the_slots_and_which_wait_for_what():
    from iks_gpu_migration.cli import status

    config = {"nodes": [{"name": f"n{i}", "workerId": f"w{i}", "stage": "device-plugin"} for i in range(1, 6)],
              "maxUnavailable": "2"}

    def node(name, steps, cordoned=False, found=True):
        return {"configuredName": name, "found": found, "cordoned": cordoned,
                "steps": [{"step": f"s{i}", "done": done} for i, done in enumerate(steps)]}

    done, none = [True] * 4, [False] * 4
    statuses = [node("n1", done), node("n2", [True, False, False, False]), node("n3", none, cordoned=True),
                node("n4", none), node("n5", none)]
    assert status.turns_text(config, statuses) == (
        "now: 2 of 2 slot(s) taken (n2, n3); next: n4 waits for a node in flight to be done; 1 more wait after it")
    statuses[1] = node("n2", done)
    assert "now: 1 of 2 slot(s) taken (n3); next: n4 may start now" in status.turns_text(config, statuses)
    statuses = [node(f"n{i}", done) for i in range(1, 5)] + [node("n5", none, found=False)]  # its worker replaced
    assert status.turns_text(config, statuses) == "now: 1 of 2 slot(s) taken (n5)"
    assert status.turns_text(config, [node(f"n{i}", done) for i in range(1, 6)]) == "now: every node is at its stage"
    statuses = [node("n1", done), node("n2", done), node("n3", none), {**node("n4", none), "ready": False},
                node("n5", none)]
    assert status.turns_text(config, statuses) == (
        "now: 0 of 2 slot(s) taken; NotReady, first in line: n4; next: n3 may start now (a slot is free; its gate "
        "counts capacity first); 1 more wait after it")


def test_a_selector_matching_too_few_nodes_is_named():
    views = [NodeView(f"n{i}", {"other": "x"}) for i in range(1, 6)]
    decision = gate_decision(views, ["n1"], SELECTOR, min_available=4)
    assert not decision.open
    assert "only 0 nodes outside the batch match gpuNodeSelector 'nvidia.com/gpu.present=true'" in decision.state
    assert "only" not in gate_decision(fleet(5, n4={"ready": False}), ["n1"], SELECTOR, min_available=4).state


# GPU nodes before the GPU Operator (issue 17, 5.) -------------------------------------------------------------------

IKS_GPU = {"ibm-cloud.kubernetes.io/gpu-enabled": "true", "ibm-cloud.kubernetes.io/machine-type": "gx3.16x80.l4"}


def test_the_default_selector_counts_gpu_nodes_on_ibms_drivers_and_on_the_operators():
    # IBM's drivers: only IKS's labels; migrated: the operator's label too; the temporary pool before the operator.
    views = [NodeView("ibm-1", IKS_GPU), NodeView("migrated-1", {**IKS_GPU, **GPU}), NodeView("operator-only", GPU),
             NodeView("cpu-1", {"ibm-cloud.kubernetes.io/machine-type": "bx2.4x16"}), NodeView("n1", IKS_GPU)]
    decision = gate_decision(views, ["n1"], DEFAULT_GPU_NODE_SELECTOR, min_available=3)
    assert decision.open and decision.available == ("ibm-1", "migrated-1", "operator-only")
    assert decision.missed_count == 0 and "not matched" not in decision.state
    # Today's default is yesterday's (the operator's label) plus IKS's: it never counts fewer nodes.
    assert not gate_decision(views, ["n1"], SELECTOR, min_available=3).open


def test_selector_alternatives_match_any_and_terms_all():
    both = "a=1,b=2|c=3"
    assert gate_decision([NodeView("x", {"a": "1", "b": "2"}), NodeView("y", {"a": "1"}), NodeView("z", {"c": "3"})],
                         [], both, 0).available == ("x", "z")


def test_gpu_nodes_the_selector_misses_are_named_with_their_labels():
    views = [NodeView("ibm-1", {"ibm-cloud.kubernetes.io/machine-type": "gx3.16x80.l4"}),
             NodeView("ibm-2", {"ibm-cloud.kubernetes.io/gpu-enabled": "true"}),
             NodeView("plugin-1", {}, gpu_resource=True), NodeView("n1", {}, gpu_resource=True),
             NodeView("op-1", GPU), NodeView("cpu-1", {"ibm-cloud.kubernetes.io/machine-type": "bx2.4x16"})]
    decision = gate_decision(views, ["n1"], SELECTOR, min_available=2)
    assert not decision.open and decision.missed_count == 4  # the batch's own n1 too: the selector misses it
    assert ("4 GPU node(s) not matched by gpuNodeSelector 'nvidia.com/gpu.present=true', so not counted: "
            "ibm-1 (ibm-cloud.kubernetes.io/machine-type=gx3.16x80.l4), ibm-2 (ibm-cloud.kubernetes.io/gpu-enabled="
            "true), n1 (nvidia.com/gpu capacity), plugin-1 (nvidia.com/gpu capacity); set gpu-migration:"
            "gpuNodeSelector to labels every GPU node carries") in decision.state
    assert "cpu-1" not in decision.state and "op-1 (" not in decision.state


def test_many_missed_gpu_nodes_are_counted_not_all_listed():
    decision = gate_decision([NodeView(f"n{i:02}", {}, gpu_resource=True) for i in range(25)], [], SELECTOR, 1)
    assert decision.missed_count == 25 and len(decision.missed) == 10
    assert "n09 (nvidia.com/gpu capacity) and 15 more;" in decision.state and "n10" not in decision.state


def test_an_explicit_selector_stays_as_configured():
    assert config.parse(pilot(gpuNodeSelector=SELECTOR)).gpu_node_selector == SELECTOR
    assert config.parse(pilot(gpuNodeSelector="pool=gpu|x=y,z=w")).gpu_node_selector == "pool=gpu|x=y,z=w"
    with pytest.raises(ConfigError, match=r"gpuNodeSelector 'pool=gpu\|' has an empty alternative"):
        config.parse(pilot(gpuNodeSelector="pool=gpu|"))


# The budget again before each drain (issue 17, 4.) ------------------------------------------------------------------

def test_drain_counts_only_what_is_unavailable_beyond_the_admitted_batch():
    # Batch n1..n3 admitted with n4..n6 available. At n3's drain its mates are out in every way they can be: n1
    # replaced by r1 (annotated, still NotReady), n2 cordoned by its drain; r1's old node is gone.
    views = [NodeView("r1", GPU, ready=False, config_name="n1"), NodeView("n2", GPU, unschedulable=True),
             NodeView("n3", GPU), *fleet(6)[3:]]
    decision = drain_decision(views, "n3", ["n1", "n2", "n3"], SELECTOR, min_available=3)
    assert decision.open and decision.available == ("n4", "n5", "n6") and decision.unavailable == ()


def test_drain_waits_for_a_node_that_went_away_since_the_gate_naming_it():
    views = fleet(6, n5={"ready": False})
    decision = drain_decision(views, "n3", ["n1", "n2", "n3"], SELECTOR, min_available=3)
    assert not decision.open and decision.unavailable == ("n5 (NotReady)",)
    assert "2 GPU nodes available outside the batch, 3 needed; unavailable: n5 (NotReady)" in decision.state


def test_drain_of_a_renamed_node_not_yet_tied_to_its_entry_does_not_count_it():
    # kubeVersion round: n1's node is r1 now and its config annotation is not written yet; it is the one drained
    # (Ready and schedulable until its drain cordons it).
    views = [NodeView("r1", GPU), *fleet(4)[1:]]
    decision = drain_decision(views, "r1", ["n1"], SELECTOR, min_available=3)
    assert decision.open and decision.available == ("n2", "n3", "n4")
    assert not drain_decision(views, "r1", ["n1"], SELECTOR, min_available=4).open  # r1 is never spare capacity


def test_every_migrated_node_rechecks_its_own_batch():
    from iks_gpu_migration.components.migration import drain_budgets
    cfg = config.parse(pilot(maxUnavailable="2", timeouts={"capacityGate": 600, "pollInterval": 5}))
    plan = plan_for(cfg)
    budgets = drain_budgets(cfg, plan)
    assert set(budgets) == {n for b in plan.batches for n in b.nodes}
    for turn in plan.batches:
        # `batch` grows by the nodes in flight beside it once its slot comes (migration.in_flight).
        assert budgets[turn.node] == {"index": turn.index, "round": (turn.index - 1) // 2 + 1, "batch": [turn.node],
                                      "selector": DEFAULT_GPU_NODE_SELECTOR,
                                      "min_available": plan.budget.min_available, "timeout": 600, "poll_interval": 5}
