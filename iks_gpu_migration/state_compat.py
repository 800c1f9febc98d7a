"""Stacks deployed by earlier releases keep working after the package's layout changed.

Two things in a stack's state name code:
- Each dynamic resource's provider is pickled by dill *by reference*: `__provider` holds the module path and class
  name (pulumi/dynamic/dynamic.py `serialize_provider`), and the dynamic-provider host imports that path to `read`,
  `diff` (unknown inputs) and `delete` the resource (pulumi/dynamic/__main__.py `get_provider`). Release 0.2.0 kept
  its providers in flat modules (`iks_gpu_migration.kube_providers`, ...): OLD_PROVIDERS maps each such module and
  class to where the class lives now, and `install()` (run by the package's __init__) makes the old module paths
  importable as thin aliases of the new modules. New resources are pickled under the new paths; an old pickle stays
  in state until its resource next changes, so the aliases stay.
- URNs carry the parent: resources that releases before the components declared at the stack's root and that are
  now children of a component take `aliases=WAS_AT_ROOT`, so the engine keeps them instead of replacing them.

tests/real/test_state_compat.py deploys with release 0.2.0's code and then refreshes, previews (no change), updates
and deletes with this layout.
"""
import importlib
import importlib.abc
import importlib.util
import sys
import types
from typing import Optional, Sequence

import pulumi

WAS_AT_ROOT = [pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)]

_PACKAGE = __name__.rpartition(".")[0]
# old module (release 0.2.0) -> {class pickled in state: module it lives in now}
OLD_PROVIDERS: dict[str, dict[str, str]] = {
    "kube_providers": {
        "_DraPreflightProvider": "kube.preflight",
        "_SmokeTestVerificationProvider": "kube.smoke",
        "_OperatorReadinessProvider": "kube.readiness",
        "_NodeFenceProvider": "kube.fence",
        "_NodeDrainProvider": "kube.rollback",
        "_RollbackVerificationProvider": "kube.rollback",
        "_GpuNodeInventoryProvider": "kube.inventory",
        "_OperandPlacementProvider": "kube.operands",
        "_PendingGpuPodsProvider": "kube.operands",
    },
    "node_switch": {"_NodePathSwitchProvider": "kube.switch"},
    "capacity_gate": {"_CapacityGateProvider": "kube.capacity_gate"},
    "iks_providers": {
        "MasterVersionProvider": "iks.master",
        "WorkerReplacementProvider": "iks.replacement",
        "TempGpuPoolProvider": "iks.pool",
    },
}


class _OldModuleLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name, f"Alias of release 0.2.0's {spec.name} (see {__name__}).")

    def exec_module(self, module: types.ModuleType) -> None:
        for name, new in OLD_PROVIDERS[module.__name__.rpartition(".")[2]].items():
            setattr(module, name, getattr(importlib.import_module(f"{_PACKAGE}.{new}"), name))


class _OldModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: object = None):
        package, _, old = fullname.rpartition(".")
        if package != _PACKAGE or old not in OLD_PROVIDERS:
            return None
        return importlib.util.spec_from_loader(fullname, _OldModuleLoader())


def install() -> None:
    """Make the old module paths importable (once per process)."""
    if not any(isinstance(f, _OldModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_OldModuleFinder())
