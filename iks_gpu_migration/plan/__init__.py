"""The order of a fleet migration, decided before anything is declared: nodes -> batches (batches.py) -> gates
(gates.py). Pure: no Pulumi, no cluster."""
from .batches import Batch, Budget, MaxUnavailable, Plan, PlanError, make_plan, parse_max_unavailable, plan_for, \
    resolve_max_unavailable
from .gates import GateDecision, NodeView, gate_decision, selector_matches

__all__ = ["Batch", "Budget", "GateDecision", "MaxUnavailable", "NodeView", "Plan", "PlanError", "gate_decision",
           "make_plan", "parse_max_unavailable", "plan_for", "resolve_max_unavailable", "selector_matches"]
