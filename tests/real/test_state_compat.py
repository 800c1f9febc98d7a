"""A stack deployed with the current release keeps working with this tree's code, under the real CLI and engine.

Pulumi stores each dynamic resource with its provider pickled by dill BY REFERENCE (`__provider`: module + class,
e.g. `iks_gpu_migration.kube_providers._NodeFenceProvider`), and `refresh` (Read) and deletions (Delete) unpickle
the one in the state, not this tree's. So a state made by the release (tests/real/release.py: its package from git,
run by the real CLI in a subprocess whose program and dynamic-provider host import it) must `refresh`, `preview`
clean, `up` a change and delete its resources with this tree's code on the same stack and cluster.
"""
import base64
import os

from .project import EVERY_UP_CHECKS, meaningful, planned_changes
from .release import (
    RELEASE,
    REPO,
    SITECUSTOMIZE,
    export,
    imports,
    materialise,
    pickled_globals,
    provider_pickles,
    resource_ids,
    up_with_release,
)
from .scenario_env import PILOT, PILOT_STAGES, PLUGIN, A, B, C, Events

# ComponentResources added after release 0.2.0 (iks_gpu_migration/components/): created by the first preview/up.
NEW_COMPONENTS = {"operator": "+", "dra-path": "+", "rollout": "+"}
KUBE, IKS = "iks_gpu_migration.kube_providers", "iks_gpu_migration.iks_providers"
SWITCH, GATE = "iks_gpu_migration.node_switch", "iks_gpu_migration.capacity_gate"
# Every dynamic resource of PILOT_STAGES (A dra, B device-plugin, C ibm-managed) and the provider class the release
# pickles for it, by reference to its module.
RELEASE_PROVIDERS = {
    "gpu-node-inventory": (KUBE, "_GpuNodeInventoryProvider"),
    "master-version": (IKS, "MasterVersionProvider"),
    "operand-placement": (KUBE, "_OperandPlacementProvider"),
    "batch-1-gate": (GATE, "_CapacityGateProvider"),
    "batch-2-gate": (GATE, "_CapacityGateProvider"),
    "batch-1-dra-preflight": (KUBE, "_DraPreflightProvider"),
    **{f"{n}-fence": (KUBE, "_NodeFenceProvider") for n in (A, B, C)},
    **{f"{n}-replacement": (IKS, "WorkerReplacementProvider") for n in (A, B)},
    **{f"{n}-switch": (SWITCH, "_NodePathSwitchProvider") for n in (A, B)},
    **{f"{n}-operator-ready": (KUBE, "_OperatorReadinessProvider") for n in (A, B)},
    **{f"{n}-operand-placement": (KUBE, "_OperandPlacementProvider") for n in (A, B)},
    **{f"{n}-pending-gpu-pods": (KUBE, "_PendingGpuPodsProvider") for n in (A, B)},
    f"{B}-rollback": (KUBE, "_RollbackVerificationProvider"),
    f"{A}-smoke-verification": (KUBE, "_SmokeTestVerificationProvider"),
}


def host_imports(log) -> tuple[list[dict], list[dict]]:
    """The recorded iks_gpu_migration imports: (of dynamic-provider hosts, of any other process)."""
    entries = imports(log)
    host = [e for e in entries if any("pulumi/dynamic" in a or a == "pulumi.dynamic" for a in e["argv"])]
    return host, [e for e in entries if e not in host]


def test_state_made_by_the_release_refreshes_updates_and_deletes_with_this_tree(env, tmp_path):
    released, released_ids = deploy_with_release(env, tmp_path)
    stack = use_this_tree(env, tmp_path)
    refresh_and_preview(env, stack, released)
    after_up, after_up_ids = update_and_delete(env, stack, released)
    destroy_and_check_imports(env, stack, tmp_path, released, released_ids, after_up, after_up_ids)


def deploy_with_release(env, tmp_path) -> tuple[dict, dict]:
    """Phase 1: the whole migration to PILOT_STAGES with the release's code; its state names the release's modules."""
    release = materialise(tmp_path / "release") / "iks_gpu_migration"
    project, cli_env = env.project, env.project.engine.env
    pulumi, pulumi_env = project.engine.cli()
    log1 = tmp_path / "imports-release.jsonl"
    project.write_stack(release_config(env))
    output = up_with_release(release.parent, project.dir, project.engine.backend_dir, cli_env["IC_API_KEY"], log1)
    assert "release up: succeeded" in output, output[-3000:]
    host, program = host_imports(log1)
    # The program and the dynamic-provider host imported the release's modules, and only those.
    for who, entries in (("the dynamic-provider host", host), ("the program", program)):
        loaded = {e["module"] for e in entries}
        assert {KUBE, IKS, SWITCH, GATE} <= loaded, f"{who} imported only {sorted(loaded)}"
        elsewhere = [e for e in entries if not (e["origin"] or "").startswith(f"{release}/")]
        assert not elsewhere, f"{who} imported iks_gpu_migration from outside release {RELEASE}: {elsewhere[:3]}"

    deployment = export(pulumi, pulumi_env, project.dir)
    released, released_ids = provider_pickles(deployment), resource_ids(deployment)
    assert provider_pickles(deployment, "inputs") == released  # created by the release: one pickle each
    assert set(released) == set(RELEASE_PROVIDERS), (
        f"dynamic resources of the scenario: missing {sorted(set(RELEASE_PROVIDERS) - set(released))}, "
        f"unexpected {sorted(set(released) - set(RELEASE_PROVIDERS))}")
    for name, (module, cls) in RELEASE_PROVIDERS.items():
        refs = pickled_globals(released[name])
        assert (module, cls) in refs, f"{name}: __provider does not refer to {module}.{cls}: {sorted(refs)}"
        assert module.encode() in base64.b64decode(released[name])
    return released, released_ids


def release_config(env) -> dict:
    """The stack config as the release reads it: it knows no ibmCloud.allowCustomEndpoints (and forbids unknown keys);
    it trusts any https endpoint and plain http to 127.0.0.1."""
    cfg = env.config(PILOT_STAGES)
    cfg["ibmCloud"] = {k: v for k, v in cfg["ibmCloud"].items() if k != "allowCustomEndpoints"}
    return cfg


def use_this_tree(env, tmp_path):
    """Phase 2: this tree's code (the test process's imports; the provider host's PYTHONPATH starts at this tree),
    with the override this tree needs for the emulator's endpoints (the only change to the stack file)."""
    project, cli_env = env.project, env.project.engine.env
    project.write_stack(env.config(PILOT_STAGES))
    hooks = tmp_path / "import-recorder-tree"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log2 = tmp_path / "imports-tree.jsonl"
    project.engine.env = {**cli_env, "GPU_MIGRATION_IMPORT_LOG": str(log2),
                          "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), str(REPO),
                                                                      os.environ.get("PYTHONPATH")]))}
    return project.stack()


def refresh_and_preview(env, stack, released: dict) -> None:
    pulumi, pulumi_env = env.project.engine.cli()
    project = env.project
    # refresh reads every resource with the pickle in its outputs (the release's) and keeps it.
    stack.refresh(on_output=print)
    refreshed = provider_pickles(export(pulumi, pulumi_env, project.dir))
    assert refreshed == released, "refresh changed __provider of " + ", ".join(
        sorted(n for n in released if refreshed.get(n) != released[n]))

    # preview: nothing to do but the read-only checks that run on every up and the new components. Every provider
    # class's pickle changed (another module); the checks' diff (kube/provider.py _Provider) ignores `__provider`,
    # or each would show `~ update` without a changed property in the CLI's diff. The IKS providers
    # compare only their own inputs: their state keeps the release's pickle in its outputs (unpickled by refresh
    # and delete) even after an `up`, so the release's module paths must keep importing.
    shown: list[str] = []
    changes = planned_changes(stack, diff=True, on_output=shown.append)
    print("\n".join(shown))
    # The components this layout added (no cluster objects) are the only creates. Every resource they now parent was
    # at the stack's root and keeps its URN through its alias (state_compat.WAS_AT_ROOT): an alias that failed would
    # delete the old URN, and planned_changes keeps "-" for that name.
    # Each smoke pod gained its Pod Security settings (kube/pod_security.py), which a Pod can't change in place: it is
    # replaced and its smoke test runs again (its verification follows the new pod's uid); the smoke namespace gains
    # its Pod Security labels in place.
    # Each node's rollback check, readiness, operand placement and pending GPU pods are now steps of its path switch
    # (kube/switch.py): those resources go, and the switch, whose checks ran as them, stays as it is.
    # The operator's release gains placement preferences for its controllers (components/charts.py
    # OPERATOR_DEFAULTS: away from the GPU nodes a batch drains): an in-place Helm upgrade. Both releases gain Helm's
    # wait of timeouts.helm (7200 s, was the provider's 300 s): an in-place upgrade with the same chart and values.
    # A slot per node (components/slots.py): one gate and DRA preflight per node replace the batches' (a gate and a
    # preflight leave nothing behind; the new ones open at once on this converged stack).
    upgraded = {f"smoke-{A}": "+-", f"{A}-smoke-verification": "+-", "smoke-namespace": "~", "gpu-operator": "~",
                "dra-driver": "~", "batch-1-gate": "-", "batch-2-gate": "-", "batch-1-dra-preflight": "-",
                f"{A}-gate": "+", f"{B}-gate": "+", f"{A}-dra-preflight": "+",
                f"{B}-rollback": "-",
                **{f"{n}-{check}": "-" for n in (A, B)
                   for check in ("operator-ready", "operand-placement", "pending-gpu-pods")}}
    assert meaningful(changes) == {**NEW_COMPONENTS, **upgraded}, (
        f"preview after refresh plans {meaningful(changes)}:\n" + "\n".join(shown))
    assert set(changes) <= EVERY_UP_CHECKS | set(NEW_COMPONENTS) | set(upgraded), changes


def update_and_delete(env, stack, released: dict) -> tuple[dict, dict]:
    pulumi, pulumi_env = env.project.engine.cli()
    project = env.project

    # up with a change that updates and deletes resources the release made: B device-plugin -> dra. B's rollback
    # check goes (deleted with the release's pickle), its switch runs, its smoke test is new.
    project.write_stack(env.config({**PILOT_STAGES, B: "dra"}))
    events = Events()
    result = stack.up(on_output=print, on_event=events)
    assert result.summary.result == "succeeded"
    ops = {}
    for op, name, kind in events.steps:
        if kind == "pre":
            ops.setdefault(name, set()).add(op)
    # Deleted (their Delete unpickles the release's __provider from the state): the rollback check and readiness
    # (steps of the switch now), and the originals of what B's new stage replaces (the switch: delete before
    # replace; the batch gate).
    deleted = {n for n, o in ops.items() if o & {"delete", "delete-replaced"}}
    assert {f"{B}-rollback", f"{B}-switch", f"{B}-operator-ready", "batch-2-gate"} <= deleted, ops
    assert deleted - {f"smoke-{A}"} <= set(released), deleted - set(released)  # A's smoke pod: replaced (above)
    print(f"up deleted {len(deleted)} resources with the release's __provider: {sorted(deleted)}")
    new_b = result.outputs[f"node:{B}"].value["nodeName"]
    labels = env.node(new_b).metadata.labels
    assert labels[PILOT] == "pilot" and labels[PLUGIN] == "false"
    assert env.record(new_b)["result"] == "passed" and not env.node(new_b).spec.unschedulable
    state = export(pulumi, pulumi_env, project.dir)
    after_up, after_up_ids = provider_pickles(state), resource_ids(state)
    assert f"{B}-rollback" not in after_up
    return after_up, after_up_ids


def destroy_and_check_imports(env, stack, tmp_path, released: dict, released_ids: dict, after_up: dict,
                              after_up_ids: dict) -> None:
    pulumi, pulumi_env = env.project.engine.cli()
    log2 = tmp_path / "imports-tree.jsonl"
    # destroy deletes the rest, among them the resources the release made whose outputs still hold its pickle (same
    # id): Delete unpickles that one.
    still_released = sorted(n for n, p in after_up.items()
                            if released.get(n) == p and released_ids.get(n) == after_up_ids[n])
    assert {"master-version", f"{A}-replacement"} <= set(still_released), still_released
    print(f"destroy deletes {len(still_released)} resources with the release's __provider: {still_released}")
    stack.destroy(on_output=print)
    assert provider_pickles(export(pulumi, pulumi_env, env.project.dir)) == {}

    # Every provider operation of phase 2 ran this tree's modules.
    # The release's module paths were imported as this tree's aliases (state_compat: no file behind them), every other
    # module from this tree.
    host2, _ = host_imports(log2)
    old_paths = {KUBE, IKS, SWITCH, GATE}
    assert {e["module"] for e in host2} >= old_paths, host2
    assert all(e["origin"] is None for e in host2 if e["module"] in old_paths), [e for e in host2 if e["module"] in old_paths]
    outside = [e for e in host2 if e["module"] not in old_paths and not (e["origin"] or "").startswith(f"{REPO}/")]
    assert not outside, outside[:3]
