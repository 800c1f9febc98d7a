"""Runs the Pulumi program under mocks and records every resource it registers."""
import json
import pathlib
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pulumi
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.rpc import _special_secret_sig as SECRET_SIG, _special_sig_key as SECRET_SIG_KEY

from iks_gpu_migration import config
from iks_gpu_migration.cli import status
from iks_gpu_migration.components.migration import Declared, export
from iks_gpu_migration.components import migration

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPLACEMENT = "pulumi-python:dynamic/gpu-migration:WorkerReplacement"


def stack_config(stack: str) -> dict[str, Any]:
    """The `gpu-migration:*` values of Pulumi.<stack>.yaml, keys without the namespace."""
    return status.stack_config(ROOT / f"Pulumi.{stack}.yaml")


@dataclass
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]
    secret_outputs: list[str] = field(default_factory=list)  # the option additional_secret_outputs

    @property
    def manifest(self) -> dict[str, Any]:
        return {k: v for k, v in self.inputs.items() if not k.startswith("__")}


def fake_outputs(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """What the real providers would report, so dependants see plausible values."""
    extra: dict[str, Any] = {}
    if name.endswith("-replacement"):
        extra = {"old_worker_id": inputs["worker_id"], "new_worker_id": f"{inputs['worker_id']}-new",
                 "node_name": inputs["node_name"]}
    elif name.endswith("-switch"):
        extra = {"rolling_back": False, "switched": inputs.get("target") == "dra"}
    elif name.endswith("-smoke-verification"):
        extra = {"result": "passed", "gpu_uuid": "GPU-0000", "device": "gpu-0", "claim": "claim"}
    elif inputs.get("kind") == "Pod":
        extra = {"metadata": {**inputs["metadata"], "uid": f"uid-{name}"}}
    return {**inputs, **extra}


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.registered: list[Registered] = []
        self.dependencies: dict[str, set[str]] = {}  # resource name -> names it depends on
        self.property_dependencies: dict[str, dict[str, set[str]]] = {}  # name -> input -> names it comes from
        self.secret_outputs: dict[str, list[str]] = {}  # name -> its additional_secret_outputs
        self.providers: dict[str, str] = {}  # resource name -> name of its explicit provider ("" for the default)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.registered.append(Registered(args.typ, args.name, dict(args.inputs),
                                          self.secret_outputs.get(args.name, [])))
        return f"{args.name}-id", fake_outputs(args.name, dict(args.inputs))

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class RecordingMonitor(MockMonitor):
    """Also records each registration's dependencies (depends_on and input dependencies), by resource name."""

    def RegisterResource(self, request):
        urns = set(request.dependencies)
        for deps in request.propertyDependencies.values():
            urns.update(deps.urns)
        self.mocks.dependencies[request.name] = {urn.rsplit("::", 1)[-1] for urn in urns}
        self.mocks.property_dependencies[request.name] = {
            prop: {urn.rsplit("::", 1)[-1] for urn in deps.urns} for prop, deps in request.propertyDependencies.items()}
        self.mocks.secret_outputs[request.name] = list(request.additionalSecretOutputs)
        # A provider reference is "<provider URN>::<provider ID>"; the URN ends with the provider's name.
        self.mocks.providers[request.name] = request.provider.rsplit("::", 2)[-2] if request.provider else ""
        return super().RegisterResource(request)


@dataclass
class Run:
    registered: list[Registered]
    declared: Any  # Declared
    dependencies: dict[str, set[str]]
    property_dependencies: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    providers: dict[str, str] = field(default_factory=dict)  # resource name -> its explicit provider's name

    def depends(self, name: str, on: str) -> bool:
        """True if `name` waits for `on`, directly or through other resources."""
        seen, todo = set(), [name]
        while todo:
            for dep in self.dependencies.get(todo.pop(), set()) - seen:
                if dep == on:
                    return True
                seen.add(dep)
                todo.append(dep)
        return False

    def named(self, name: str) -> Registered:
        matches = [r for r in self.registered if r.name == name]
        assert len(matches) == 1, f"expected one resource named {name!r}, got {[r.name for r in self.registered]}"
        return matches[0]

    def names(self) -> set[str]:
        return {r.name for r in self.registered}

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.registered if r.typ == typ]

    def kubernetes_manifests(self) -> list[dict[str, Any]]:
        """Rendered objects of every plain Kubernetes resource (not Helm releases or providers)."""
        return [
            r.manifest for r in self.registered
            if r.typ.startswith("kubernetes:") and "kind" in r.inputs and not r.typ.startswith("kubernetes:helm")
        ]


def run_declarations(declare: Callable[[], Any], config_values: Optional[dict[str, str]] = None,
                     secret_keys: Optional[list[str]] = None, preview: bool = False,
                     mocks: Optional[RecordingMocks] = None) -> tuple[RecordingMocks, Any]:
    """Call `declare` under fresh mocks (or `mocks`) and config; return the mocks (what was registered) and its result."""
    mocks = mocks or RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="gpu-migration", stack="test", preview=preview,
                             monitor=RecordingMonitor(mocks))
    pulumi.runtime.set_all_config(config_values or {}, secret_keys or [])
    holder: dict[str, Any] = {}

    @pulumi.runtime.test
    def program():
        holder["result"] = declare()

    program()
    return mocks, holder.get("result")


def registered_by(declare: Callable[[], Any]) -> list[Registered]:
    return run_declarations(declare)[0].registered


def run_program(raw: dict[str, Any], secrets: Optional[dict[str, str]] = None, preview: bool = False,
                mocks: Optional[RecordingMocks] = None) -> Run:
    """Declare the whole stack from `raw` config (camelCase keys) under mocks; config errors propagate."""
    values = {**raw, **(secrets or {})}

    def declare() -> "Declared":
        declared = migration.declare(config.load())
        export(declared)
        return declared

    mocks, declared = run_declarations(
        declare,
        {f"{config.NAMESPACE}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in values.items()},
        [f"{config.NAMESPACE}:{k}" for k in (secrets or {})],
        preview,
        mocks,
    )
    return Run(mocks.registered, declared, mocks.dependencies, mocks.property_dependencies, mocks.providers)


def kubernetes_validate(manifests: list[dict[str, Any]], tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    """Run the real `kubernetes-validate --strict -k 1.37.0` CLI over the manifests."""
    files = []
    for i, manifest in enumerate(manifests):
        path = tmp_path / f"{i:02d}-{manifest['kind'].lower()}.yaml"
        path.write_text(json.dumps(manifest))
        files.append(str(path))
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", "1.37.0", *files],
        capture_output=True, text=True,
    )


def unwrap(value: Any) -> Any:
    """Inputs as a provider sees them: secrets unwrapped."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            return unwrap(value.get("value"))
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value
