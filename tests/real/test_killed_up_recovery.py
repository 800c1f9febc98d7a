"""`python -m iks_gpu_migration.recover` under the real CLI, Helm and kube-apiserver, on the state a SIGKILLed `up`
leaves: resources whose create had started are only "pending creates" (the engine writes the operation before the
provider call and the resource after it; pkg/backend/snapshot.go). The first test makes the kill in the state, not
raced; the scenarios after it SIGKILL a real `up` at a point (as test_migration_scenarios.py does during a
replacement) and converge with `recover` plus one `up` whatever the kill cut short at that point."""
import contextlib
import json
import os
import pathlib
import signal
import time
import uuid

import pulumi
from kubernetes import client

from iks_gpu_migration.components.charts import helm_release
from iks_gpu_migration.config import HelmChart
from iks_gpu_migration.cli.recover import recover

from .kube import eventually
from .project import meaningful, planned_changes
from .scenario_env import A, B, PILOT_STAGES, WORKERS, interrupted_up, new_name

CHART_YAML = "apiVersion: v2\nname: recover-probe\nversion: 0.1.0\n"
CONFIGMAP = ("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-made\n"
             "data:\n  release: {{ .Release.Name }}\n")


def killed_mid_create(deployment: dict, names: set[str]) -> dict:
    """The deployment as a kill during these resources' creates leaves it: each is a pending create (its inputs, no
    ID, no outputs) and no longer a resource."""
    resources, pending = [], list(deployment.get("pending_operations") or [])
    for r in deployment["resources"]:
        if r["urn"].rsplit("::", 1)[1] in names:
            pending.append({"type": "creating",
                            "resource": {k: v for k, v in r.items() if k not in ("id", "outputs")}})
        else:
            resources.append(r)
    return {**deployment, "resources": resources, "pending_operations": pending}


def write_checkpoint(backend: pathlib.Path, stack: str, deployment: dict) -> None:
    """Put `deployment` in the file backend's checkpoint, as the killed engine's last write left it. (`pulumi stack
    import` can't: it drops pending operations, pkg/cmd/pulumi/stack/io.go.)"""
    path = backend / ".pulumi" / "stacks" / "gpu-migration" / f"{stack}.json"
    checkpoint = json.loads(path.read_text())
    checkpoint["checkpoint"]["latest"] = deployment
    path.write_text(json.dumps(checkpoint))
    path.with_name(path.name + ".attrs").unlink(missing_ok=True)  # gocloud fileblob's md5 of the old content


def helm_records(core: client.CoreV1Api, namespace: str, release: str) -> list[str]:
    """Helm's release records (helm/helm pkg/storage/driver/secrets.go): `<revision>:<status label>`."""
    found = core.list_namespaced_secret(namespace, label_selector=f"owner=helm,name={release}").items
    return sorted(f"{s.metadata.labels['version']}:{s.metadata.labels['status']}" for s in found)


def test_recover_adopts_what_a_killed_up_made_and_drops_what_it_did_not(cluster, project, tmp_path):
    core = client.CoreV1Api(cluster.api_client)
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(CHART_YAML)
    (chart / "templates" / "configmap.yaml").write_text(CONFIGMAP)
    ns = f"recover-{uuid.uuid4().hex[:6]}"
    done, stuck = f"{ns}-done", f"{ns}-stuck"  # release names: the first finished, the second was killed mid-install

    def program():
        import pulumi_kubernetes as k8s
        opts = pulumi.ResourceOptions(provider=k8s.Provider("local", kubeconfig=cluster.kubeconfig.read_text()))
        spec = HelmChart(chart=str(chart), version="0.1.0", namespace=ns)
        first = helm_release(done, spec, {}, opts)
        helm_release(stuck, spec, {}, opts)
        for name in ("kept", "gone"):
            k8s.core.v1.ConfigMap(name, metadata={"name": name, "namespace": ns}, data={"v": "1"},
                                  opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[first])))

    project.write_stack({})
    stack = project.stack("recover", program)
    assert stack.up(on_output=print).summary.result == "succeeded"
    pulumi_cli, cli_env = project.engine.cli()

    # The kill: all four creates pending. `done` and `kept` were made; `gone` was not; `stuck` was cut short while
    # Helm installed it, so its record says pending-install (the objects it made stay).
    core.delete_namespaced_config_map("gone", ns)
    record = f"sh.helm.release.v1.{stuck}.v1"
    core.patch_namespaced_secret(record, ns, {"metadata": {"labels": {"status": "pending-install"}}})
    write_checkpoint(project.engine.backend_dir, "recover",
                     killed_mid_create(stack.export_stack().deployment, {done, stuck, "kept", "gone"}))
    assert len(stack.export_stack().deployment["pending_operations"]) == 4

    lines: list[str] = []
    assert recover("recover", pulumi_cli, cli_env, out=lines.append, kubeconfig=str(cluster.kubeconfig),
                   cwd=str(project.dir)) == 0, lines
    print("\n".join(lines))
    state = stack.export_stack().deployment
    assert not state.get("pending_operations")
    ids = {r["urn"].rsplit("::", 1)[1]: r.get("id") for r in state["resources"]}
    assert ids[done] == f"{ns}/{done}" and ids["kept"] == f"{ns}/kept"  # adopted and read back by the refresh
    assert "gone" not in ids and stuck not in ids  # never made / its install record removed: created again
    assert helm_records(core, ns, stuck) == []

    result = stack.up(on_output=print)
    assert result.summary.result == "succeeded"
    changes = result.summary.resource_changes
    assert (changes.get("create"), changes.get("update")) == (2, 1), changes  # gone and stuck made; done upgraded
    # Not installed again: the adopted release gets one `helm upgrade` with the same chart and values, since its
    # client-side options (atomic, timeout, the chart's path) can't be read back from the cluster.
    assert helm_records(core, ns, done) == ["1:superseded", "2:deployed"]
    assert helm_records(core, ns, stuck) == ["1:deployed"]  # installed again; Helm adopted its ConfigMap
    made = core.read_namespaced_config_map(f"{stuck}-made", ns)
    assert made.metadata.annotations["meta.helm.sh/release-name"] == stuck
    assert core.read_namespaced_config_map("gone", ns).data == {"v": "1"}
    assert planned_changes(stack) == {}
    stack.destroy(on_output=print)
    core.delete_namespace(ns)



SMOKE_LABEL = "app.kubernetes.io/name=gpu-smoke-test"


def killed_up(env, when, what: str, **extra):
    """`pulumi up` of the pilot (A dra, B device-plugin, C ibm-managed; A and B in one batch, same pool and zone)
    SIGKILLed once `when()` holds, its leftover plugin processes ended as docs/recovery.md says; returns the stack."""
    env.project.write_stack(env.config(PILOT_STAGES, maxUnavailable=2, **extra))
    stack = env.project.stack()
    plugins: list[int] = []
    interrupted_up(stack, when, what, "SIGKILL", timeout=180, plugins=plugins)
    assert plugins, "the killed CLI had no plugin processes"
    for pid in plugins:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stack


def recover_then_one_up(env, stack):
    """The documented recovery: `recover`, then one `up`, which must succeed; returns its result."""
    pulumi_cli, cli_env = env.project.engine.cli()
    lines: list[str] = []
    assert recover("local", pulumi_cli, cli_env, out=lines.append, kubeconfig=str(env.cluster.kubeconfig),
                   cwd=str(env.project.dir)) == 0, lines
    print("\n".join(lines))
    result = stack.up(on_output=print)
    assert result.summary.result == "succeeded"
    return result


def test_killed_after_both_batch_mates_requested_their_replacement_converges(env):
    """Both replaceWorker calls of a batch (same pool and zone) are in, then SIGKILL: the new workers are linked to
    nothing. The resumed replacements pair them deterministically; neither stops as ambiguous."""
    env.iks.stick_new_workers = True  # both new workers stay provisioning until the kill is done
    stack = killed_up(env, lambda: env.iks.count("POST", "/v2/vpc/replaceWorker") == 2, "both replaceWorker calls")
    time.sleep(1)  # a third replaceWorker would show now (the kill came right after the second)
    assert sorted(env.iks.replaced) == sorted([WORKERS[A], WORKERS[B]]), env.iks.replaced
    env.iks.stuck.clear()
    env.iks.stick_new_workers = False
    result = recover_then_one_up(env, stack)
    assert sorted(env.iks.replaced) == sorted([WORKERS[A], WORKERS[B]]), env.iks.replaced  # one per node
    new_a, new_b = new_name(result, A), new_name(result, B)
    assert new_a != new_b and {new_a, new_b}.isdisjoint({A, B})
    assert env.record(new_a)["result"] == "passed"
    assert not env.node(new_a).spec.unschedulable and not env.node(new_b).spec.unschedulable
    assert meaningful(planned_changes(stack)) == {}


def test_killed_while_the_smoke_pod_existed_converges(env):
    """SIGKILL while the dra node's smoke pod exists; by the time of the recovery it has finished and the resourceclaim
    controller has deleted its claim, so nothing can judge it any more. The next `up` runs the test again."""
    def smoke_pod():
        pods = env.core.list_pod_for_all_namespaces(label_selector=SMOKE_LABEL).items
        return pods[0] if pods else None

    stack = killed_up(env, smoke_pod, "the smoke pod")
    pod = smoke_pod()
    resource = client.ResourceV1Api(env.cluster.api_client)
    eventually(lambda: env.core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace).status.phase
               == "Succeeded", "the killed run's smoke pod to finish", timeout=60)
    eventually(lambda: not resource.list_namespaced_resource_claim(pod.metadata.namespace).items,
               "the resourceclaim controller to delete the finished pod's claim", timeout=60)
    result = recover_then_one_up(env, stack)
    new_a = new_name(result, A)
    record = env.record(new_a)
    assert record["result"] == "passed", record
    assert record["podUid"] != pod.metadata.uid  # judged on a pod that ran again, not the killed run's
    assert not env.node(new_a).spec.unschedulable
    assert sorted(env.iks.replaced) == sorted([WORKERS[A], WORKERS[B]]), env.iks.replaced
    assert meaningful(planned_changes(stack)) == {}
