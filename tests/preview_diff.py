"""What `pulumi preview` shows between two configs, computed under Pulumi mocks (no engine, no cloud).

Both configs are declared under mocks; resources only in the new one are creates (+), only in the old one deletes
(-), and for the others each provider's own rule decides between no change, update (~) and replace (+-):
  - dynamic providers (ours): their diff() on the old outputs and new inputs, as the engine calls it;
  - Kubernetes objects: pulumi-kubernetes replaces on changes to fields it lists as force-new
    (pulumi/pulumi-kubernetes provider/pkg/provider/diff.go: forceNew, metadataForceNewProperties — metadata.name and
    metadata.namespace, and for Pod the nodeSelector and the containers' image/command/resources) and updates
    otherwise; a Helm Release replaces on another name or namespace;
  - pulumi-command local.Command updates on any input change except `triggers` (which replaces); on update it runs
    `create` again when no `update` command is set (pulumi/pulumi-command provider/pkg/provider/local/command.go).
A resource that is created or replaced has unknown outputs during preview, and so has a dynamic resource that is
updated: its provider does not support previews, so the engine takes its new inputs as its state and every output
that is not an input is unknown (pulumi/pulumi pkg/resource/plugin/provider_plugin.go Update: "If the provider does
not support previews, return the inputs as the state"; the Python dynamic provider's Configure sets no
supportsPreview). Every input computed from them is unknown too (and differs from the old value); the diff is
repeated until nothing more changes. Component resources
(GpuNode) show as updated when their inputs change (pulumi/pulumi pkg/resource/deploy/step_generator.go: diff,
"no provider").
Checks that look at the cluster again on every `up` (kube/provider.py _EveryUp: the GPU node inventory and the operand
placement checks; iks/identity.py: the cluster identity) always show as updated; they are listed apart, under "every up", so each case shows what the
config change itself does.
"""
import base64
from typing import Any

import dill

from harness import fake_outputs, run_program


class _Unknown:
    """A value only known after `up` (an output of a resource created or replaced in this update)."""

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __repr__(self):
        return "<unknown>"


UNKNOWN = _Unknown()

# Input paths whose change replaces the resource, per resource type (see module docstring).
FORCE_NEW = {
    "kubernetes:core/v1:Pod": ("metadata.name", "metadata.namespace", "spec.nodeSelector", "spec.containers",
                               "spec.restartPolicy"),
    "kubernetes:core/v1:NodePatch": ("metadata.name",),
    "kubernetes:core/v1:Namespace": ("metadata.name",),
    "kubernetes:resource.k8s.io/v1:DeviceClass": ("metadata.name",),
    "kubernetes:helm.sh/v3:Release": ("name", "namespace"),
    "command:local:Command": ("triggers",),
}


def _get(inputs: dict, path: str) -> Any:
    for part in path.split("."):
        inputs = inputs.get(part) if isinstance(inputs, dict) else None
    return inputs


def _public(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if not k.startswith("__")}


def _provider(inputs: dict):
    serialized = inputs["__provider"]
    return dill.loads(base64.b64decode(serialized["value"] if isinstance(serialized, dict) else serialized))


def _runs_every_up(inputs: dict) -> bool:
    from iks_gpu_migration.iks.identity import ClusterIdentityProvider
    from iks_gpu_migration.kube.provider import _EveryUp
    return "__provider" in inputs and isinstance(_provider(inputs), (_EveryUp, ClusterIdentityProvider))


def _change(name: str, typ: str, old: dict, new: dict) -> str:
    """'' (no change), '~' (update) or '+-' (replace)."""
    if typ.startswith("pulumi-python:dynamic/"):
        # The engine hands a dynamic provider's diff the old *outputs* (state) and the new inputs.
        result = _provider(new).diff("id", _public(fake_outputs(name, old)), _public(new))
        if result.replaces:
            return "+-"
        return "~" if result.changes else ""
    if _public(old) == _public(new):
        return ""
    if any(_get(old, p) != _get(new, p) for p in FORCE_NEW.get(typ, ())):
        return "+-"
    return "~"


def preview(old_raw: dict, new_raw: dict) -> dict[str, set[str]]:
    """{"+": creates, "-": deletes, "~": updates, "+-": replaces, "every up": updates of checks that run on every
    `up` whatever changed} by resource name."""
    old = {r.name: r for r in run_program(old_raw).registered}
    run = run_program(new_raw)
    new = {r.name: r for r in run.registered}
    created = set(new) - set(old)
    changes: dict[str, str] = {}
    while True:
        unknown_outputs = created | {n for n, c in changes.items()
                                     if c == "+-" or (c == "~" and new[n].typ.startswith("pulumi-python:dynamic/"))}
        found = {}
        for name in set(old) & set(new):
            inputs = dict(new[name].inputs)
            for prop, sources in run.property_dependencies.get(name, {}).items():
                if prop in inputs and sources & unknown_outputs:
                    inputs[prop] = UNKNOWN
            change = _change(name, new[name].typ, old[name].inputs, inputs)
            if change:
                found[name] = change
        if found == changes:
            break
        changes = found
    out: dict[str, set[str]] = {"+": created, "-": set(old) - set(new), "~": set(), "+-": set(), "every up": set()}
    for name, change in changes.items():
        every_up = change == "~" and new[name].typ.startswith("pulumi-python:dynamic/") and _runs_every_up(
            new[name].inputs)
        out["every up" if every_up else change].add(name)
    return out
