"""`python -m iks_gpu_migration.cli.recover` under the real CLI, Helm and kube-apiserver, on the state a SIGKILLed `up`
leaves: resources whose create had started are only "pending creates" (the engine writes the operation before the
provider call and the resource after it; pkg/backend/snapshot.go), and the killed CLI's lock file stays. The first
test makes the kill in the state, not raced; the scenarios after it SIGKILL a real `up` at a point (as
test_migration_scenarios.py does during a replacement) and converge with `recover` plus one `up` whatever the kill cut
short at that point."""
import base64
import contextlib
import getpass
import gzip
import json
import os
import pathlib
import re
import shlex
import signal
import socket
import stat
import subprocess
import time
import uuid
from datetime import datetime
from typing import Optional

import pulumi
from kubernetes import client

from iks_gpu_migration.components.charts import helm_release
from iks_gpu_migration.config import HelmChart
from iks_gpu_migration.cli.recover import recover
from iks_gpu_migration.cli.recover.holders import is_pulumi
from iks_gpu_migration.cli.recover.processes import read_proc

from .kube import eventually
from .project import meaningful, planned_changes
from .scenario_env import A, B, PILOT_STAGES, WORKERS, cli_processes, interrupted_up, new_name
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


def first_deployed(core: client.CoreV1Api, namespace: str, release: str) -> datetime:
    """`info.first_deployed` of a release's first record (a Secret whose `release` is base64 of gzipped JSON, helm/helm
    pkg/storage/driver/util.go; the API base64-encodes it once more)."""
    secret = core.read_namespaced_secret(f"sh.helm.release.v1.{release}.v1", namespace)
    record = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(secret.data["release"]))))
    stamp = re.sub(r"(\.\d{6})\d+", r"\1", record["info"]["first_deployed"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp)


def leave_lock(backend: pathlib.Path, stack: str, started: datetime) -> pathlib.Path:
    """The lock file a killed CLI leaves (pulumi pkg/backend/diy/lock.go): its pid (of a process that has ended), this
    host, and when it took the stack."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    path = backend / ".pulumi" / "locks" / "organization" / "gpu-migration" / stack / f"{uuid.uuid4()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": ended.pid, "username": getpass.getuser(), "hostname": socket.gethostname(),
                                "timestamp": started.isoformat()}))
    return path


def pulumi_manager(obj) -> str:
    """The one server-side-apply field manager of pulumi-kubernetes on an object."""
    managers = [m.manager for m in obj.metadata.managed_fields
                if m.operation == "Apply" and m.manager.startswith("pulumi-kubernetes-")]
    assert len(managers) == 1, obj.metadata.managed_fields
    return managers[0]


def run_recover(project, stack: str, **kwargs) -> tuple[int, str]:
    """recover in the project's directory under the real CLI: its exit code and what it printed."""
    pulumi_cli, cli_env = project.engine.cli()
    lines: list[str] = []
    code = recover(stack, kwargs.pop("pulumi", pulumi_cli), cli_env, out=lines.append, cwd=str(project.dir), **kwargs)
    print("\n".join(lines))
    return code, "\n".join(lines)


def failing_refresh(tmp_path: pathlib.Path, pulumi_cli: str) -> str:
    """The real CLI, except that `pulumi refresh` fails (as it does when the cluster is unreachable)."""
    wrapper = tmp_path / "pulumi-failing-refresh"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = refresh ]; then echo "injected: refresh failed" >&2; exit 1; fi\n'
                       f'exec {shlex.quote(pulumi_cli)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_recover_adopts_only_what_the_killed_up_made(cluster, project, tmp_path):
    """The killed `up` had installed two Helm releases (one finished, one cut short: pending-install) and applied a
    ConfigMap; another ConfigMap it never made. A third release, `admin`, was first deployed before the killed update
    started, as an admin's install of a release of that name would be. The dry run shows the plan and changes
    nothing; `--yes` refuses `admin` without --force; with it, a refresh that fails leaves adopted resources never
    read, which a second recover finds and reads. One `up` converges, a later change of the adopted ConfigMap applies
    (its field manager was kept), and the printed command restores the backup."""
    core = client.CoreV1Api(cluster.api_client)
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(CHART_YAML)
    (chart / "templates" / "configmap.yaml").write_text(CONFIGMAP)
    ns = f"recover-{uuid.uuid4().hex[:6]}"
    admin, done, stuck = f"{ns}-admin", f"{ns}-done", f"{ns}-stuck"
    label = {"v": "1"}

    def program():
        import pulumi_kubernetes as k8s
        opts = pulumi.ResourceOptions(provider=k8s.Provider("local", kubeconfig=cluster.kubeconfig.read_text()))
        spec = HelmChart(chart=str(chart), version="0.1.0", namespace=ns)
        first = helm_release(admin, spec, {}, opts)
        after = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[first]))
        made = helm_release(done, spec, {}, after)
        helm_release(stuck, spec, {}, after)
        for name in ("kept", "gone"):
            k8s.core.v1.ConfigMap(name, metadata={"name": name, "namespace": ns, "labels": dict(label)},
                                  data={"v": "1"},
                                  opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[made])))

    project.write_stack({})
    stack = project.stack("recover", program)
    assert stack.up(on_output=print).summary.result == "succeeded"
    manager = pulumi_manager(core.read_namespaced_config_map("kept", ns))
    urn = {r["urn"].rsplit("::", 1)[1]: r["urn"] for r in stack.export_stack().deployment["resources"]}

    # The kill: all five creates pending, the CLI's lock left behind; it took the stack after `admin` was installed.
    admin_at, done_at = first_deployed(core, ns, admin), first_deployed(core, ns, done)
    assert admin_at < done_at
    lock = leave_lock(project.engine.backend_dir, "recover", admin_at + (done_at - admin_at) / 2)
    core.delete_namespaced_config_map("gone", ns)
    record = f"sh.helm.release.v1.{stuck}.v1"
    core.patch_namespaced_secret(record, ns, {"metadata": {"labels": {"status": "pending-install"}}})
    write_checkpoint(project.engine.backend_dir, "recover",
                     killed_mid_create(stack.export_stack().deployment, {admin, done, stuck, "kept", "gone"}))
    killed = stack.export_stack().deployment
    assert len(killed["pending_operations"]) == 5
    backups = project.dir / ".recover-backups"
    kubeconfig = str(cluster.kubeconfig)

    def unchanged():
        assert stack.export_stack().deployment == killed
        assert lock.exists() and helm_records(core, ns, stuck) == ["1:pending-install"] and not backups.exists()

    # The dry run (with --force: the whole plan) changes nothing.
    code, text = run_recover(project, "recover", kubeconfig=kubeconfig, force=True)
    assert code == 0, text
    assert "`pulumi cancel` removes the stack's lock" in text and "that process no longer runs" in text
    assert f"adopt {urn[done]} as {ns}/{done}: first deployed" in text
    assert f"adopt {urn['kept']} as {ns}/kept: pulumi-kubernetes applied it (field manager {manager})" in text
    assert f"clear {urn['gone']}: {ns}/gone is not in the cluster" in text
    assert f"remove Helm record(s) {ns}/{record} of {urn[stuck]}" in text
    assert f"needs --force: adopt {urn[admin]} as {ns}/{admin}: first deployed" in text
    assert "before the killed update started" in text
    unchanged()
    # --yes without --force: `admin` is not this stack's, so nothing is done.
    code, text = run_recover(project, "recover", kubeconfig=kubeconfig, yes=True)
    assert code == 1 and f"need --force ({urn[admin]})" in text, text
    unchanged()

    # --yes --force; the refresh after the import fails.
    pulumi_cli, cli_env = project.engine.cli()
    code, text = run_recover(project, "recover", kubeconfig=kubeconfig, yes=True, force=True,
                             pulumi=failing_refresh(tmp_path, pulumi_cli))
    assert code == 1 and "injected: refresh failed" in text and "redoes the refresh" in text, text
    [backup] = backups.glob("recover-*.json")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600 and stat.S_IMODE(backups.stat().st_mode) == 0o700
    assert (backups / ".gitignore").read_text().splitlines()[-1] == "*"
    saved = json.loads(backup.read_text())
    assert saved["version"] == 3 and len(saved["deployment"]["pending_operations"]) == 5
    restore = re.search(r"with: (pulumi stack import --stack recover --file \S+)$", text, re.M).group(1)
    assert shlex.split(restore)[-1] == str(backup)
    assert not lock.exists() and helm_records(core, ns, stuck) == []
    # A second recover finds what the import adopted and no refresh read, and reads it.
    code, text = run_recover(project, "recover", kubeconfig=kubeconfig, yes=True)
    assert code == 0 and "adopted resource(s) never read from the cluster" in text and urn[done] in text, text
    state = {r["urn"].rsplit("::", 1)[1]: r for r in stack.export_stack().deployment["resources"]}
    assert not stack.export_stack().deployment.get("pending_operations")
    assert state[done]["id"] == f"{ns}/{done}" and state[admin]["id"] == f"{ns}/{admin}"
    assert state["kept"]["id"] == f"{ns}/kept" and state["kept"]["outputs"]["data"] == {"v": "1"}
    assert state["kept"]["outputs"]["__fieldManager"] == manager  # seeded from managedFields, kept by the refresh
    assert "gone" not in state and stuck not in state  # never made / its install record removed: created again

    result = stack.up(on_output=print)
    assert result.summary.result == "succeeded"
    changes = result.summary.resource_changes
    assert (changes.get("create"), changes.get("update")) == (2, 2), changes  # gone, stuck made; done, admin upgraded
    # Not installed again: an adopted release gets one `helm upgrade` with the same chart and values, since its
    # client-side options (atomic, timeout, the chart's path) can't be read back from the cluster.
    assert helm_records(core, ns, done) == ["1:superseded", "2:deployed"]
    assert helm_records(core, ns, stuck) == ["1:deployed"]  # installed again; Helm adopted its ConfigMap
    assert core.read_namespaced_config_map(f"{stuck}-made", ns).metadata.annotations[
        "meta.helm.sh/release-name"] == stuck
    assert core.read_namespaced_config_map("gone", ns).data == {"v": "1"}
    # A change of the adopted ConfigMap (an update, not a replacement: pulumi-kubernetes replaces a ConfigMap whose
    # data changes) applies as the field manager that owns its fields; a new one would meet "Server-Side Apply field
    # conflict" on .metadata.labels.v.
    label["v"] = "2"
    changed = stack.up(on_output=print)
    assert changed.summary.result == "succeeded" and changed.summary.resource_changes.get("update") == 2  # kept, gone
    kept = core.read_namespaced_config_map("kept", ns)
    assert kept.metadata.labels == {"v": "2"} and pulumi_manager(kept) == manager
    assert planned_changes(stack) == {}

    # The printed command puts the state from before recover back (less its pending operations: import drops them).
    restored = subprocess.run([pulumi_cli, *shlex.split(restore)[1:]], cwd=project.dir, env=cli_env,
                              capture_output=True, text=True)
    assert restored.returncode == 0, restored.stderr
    assert [r["urn"] for r in stack.export_stack().deployment["resources"]] == [r["urn"] for r in killed["resources"]]
    stack.destroy(on_output=print)
    core.delete_namespace(ns)


SMOKE_LABEL = "app.kubernetes.io/name=gpu-smoke-test"


def killed_up(env, when, what: str, leftovers: Optional[list[int]] = None, **extra):
    """`pulumi up` of the pilot (A dra, B device-plugin, C ibm-managed; A and B in one batch, same pool and zone)
    SIGKILLed once `when()` holds; returns the stack. The killed CLI's plugin processes live on: they are ended by
    their PIDs, or left running with their PIDs in `leftovers`."""
    env.project.write_stack(env.config(PILOT_STAGES, maxUnavailable=2, **extra))
    stack = env.project.stack()
    plugins: list[int] = []
    interrupted_up(stack, when, what, "SIGKILL", timeout=180, plugins=plugins)
    assert plugins, "the killed CLI had no plugin processes"
    if leftovers is not None:
        leftovers += plugins
        return stack
    for pid in plugins:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stack


def recover_then_one_up(env, stack):
    """The documented recovery: `recover` (a dry run, which changes nothing), `recover --yes`, then one `up`, which
    must succeed; returns its result. recover reads the cluster of the stack's `gpu-migration:kubeconfig` (there is
    no ambient kubeconfig here)."""
    killed = stack.export_stack().deployment
    code, text = run_recover(env.project, "local")
    assert code == 0 and "dry run: nothing changed" in text, text
    assert stack.export_stack().deployment == killed
    code, text = run_recover(env.project, "local", yes=True)
    assert code == 0, text
    result = stack.up(on_output=print)
    assert result.summary.result == "succeeded"
    return result


def test_killed_after_both_batch_mates_requested_their_replacement_converges(env):
    """Both replaceWorker calls of a batch (same pool and zone) are in, then SIGKILL: the canary's new worker reached
    Ready before its batch-mate's request went (iks/pool_rules.py), the batch-mate's is linked to nothing. The resumed
    replacement finds its own, never the canary's; nothing stops as ambiguous. Before the kill, while the update
    runs, recover stops and names it; after, it stops and names the killed CLI's plugins still running."""
    running: dict = {}

    def both_calls_then_recover():
        if env.iks.count("POST", "/v2/vpc/replaceWorker") == 1:
            env.iks.stick_new_workers = True  # the canary's new worker exists: the batch-mate's stays provisioning
        if env.iks.count("POST", "/v2/vpc/replaceWorker") != 2:
            return False
        running["cli"] = cli_processes()
        running["run"] = run_recover(env.project, "local", yes=True)
        return True

    leftovers: list[int] = []
    stack = killed_up(env, both_calls_then_recover, "both replaceWorker calls", leftovers)
    [cli], (code, text) = running["cli"], running["run"]
    assert code == 1 and "stopped, nothing changed" in text, text
    assert re.search(rf"held by a running update: \S+ \(pid {cli}\) since", text), text
    assert f"pid {cli} `" in text  # the CLI itself, among the project's processes
    assert not (env.project.dir / ".recover-backups").exists()
    time.sleep(1)  # a third replaceWorker would show now (the kill came right after the second)
    assert sorted(env.iks.replaced) == sorted([WORKERS[A], WORKERS[B]]), env.iks.replaced

    # The killed CLI's plugins still run: recover names them and stops; they are ended by the PIDs it names.
    code, text = run_recover(env.project, "local")
    plugins = [pid for pid in leftovers if (p := read_proc(pid)) and is_pulumi(p.argv)]
    assert plugins and code == 1 and all(f"pid {pid} `" in text for pid in plugins), (plugins, text)
    named = [int(pid) for pid in re.search(r"end them \(`kill ([\d ]+)`\)", text).group(1).split()]
    assert sorted(named) == sorted(plugins)
    for pid in named:
        os.kill(pid, signal.SIGKILL)
    eventually(lambda: not any(read_proc(pid) for pid in named), "the named processes to end")
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
