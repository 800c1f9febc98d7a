"""The order of a fleet migration, decided before anything is declared: nodes -> batches (batches.py) -> gates
(gates.py). Pure: no Pulumi, no cluster."""
from .batches import Batch, Budget, MaxUnavailable, Plan, PlanError, make_plan, parse_max_unavailable, plan_for, \
    resolve_max_unavailable
from .gates import DEFAULT_GPU_NODE_SELECTOR, LEGACY_DEFAULT_GPU_NODE_SELECTOR, GateDecision, NodeView, \
    drain_decision, gate_decision, gpu_hints, selector_matches

__all__ = ["Batch", "Budget", "DEFAULT_GPU_NODE_SELECTOR", "GateDecision", "LEGACY_DEFAULT_GPU_NODE_SELECTOR",
           "MaxUnavailable", "NodeView", "Plan", "PlanError", "drain_decision", "gate_decision", "gpu_hints",
           "make_plan", "parse_max_unavailable", "plan_for", "resolve_max_unavailable", "selector_matches"]
