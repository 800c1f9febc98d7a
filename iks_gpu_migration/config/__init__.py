"""The stack config (Pulumi.<stack>.yaml, namespace `gpu-migration`), validated before anything is declared: the
models (model.py; base.py, their base; fleet.py, the fleet's keys), the name grammars (grammar.py), image and chart
sources (sources.py), rules across fields (cross_checks.py), reading and reporting (loading.py)."""
from . import sources
from .loading import load, parse, raw_from_pulumi
from .model import (FIELDS, MIN_MINOR, NAMESPACE, OPERATOR_MIN_VERSION, STAGES, ConfigError, Drain, HelmChart, Hooks,
                    IbmCloud, MigrationConfig, Node, SmokeTest, Stage, Taint, TempGpuPool, Timeouts,
                    WorkerPoolRules)

__all__ = ["FIELDS", "MIN_MINOR", "NAMESPACE", "OPERATOR_MIN_VERSION", "STAGES", "ConfigError", "Drain", "HelmChart",
           "Hooks", "IbmCloud", "MigrationConfig", "Node", "SmokeTest", "Stage", "Taint", "TempGpuPool", "Timeouts",
           "WorkerPoolRules", "load", "parse", "raw_from_pulumi", "sources"]
