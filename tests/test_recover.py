"""`recover` after a killed `up`: what it decides (pure), and what it does and refuses against a stand-in `pulumi` CLI
that answers from a JSON file and logs every call (tests/real/test_killed_up_recovery.py runs it under the real CLI,
Helm and API server)."""
import base64
import gzip
import getpass
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from iks_gpu_migration.cli.recover import adopt_pending, never_read, pending_creates, provider_id, recover
from iks_gpu_migration.cli.recover import command
from iks_gpu_migration.cli.recover.adopt import HelmRecord, Step, decide_object, decide_release, pulumi_managers
from iks_gpu_migration.cli.recover.backend import broken_sidecars, parse_time, read_locks
from iks_gpu_migration.cli.recover.cluster import Cluster, decode_release
from iks_gpu_migration.cli.recover.holders import Lock, Proc, decide_cancel, judge_lock, project_processes
from iks_gpu_migration.cli.recover.processes import read_proc
from iks_gpu_migration.cli.recover.stack import foreign_urns

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
P = "urn:pulumi:pilot::gpu-migration::"
RELEASE = {"urn": P + "kubernetes:helm.sh/v3:Release::gpu-operator", "type": "kubernetes:helm.sh/v3:Release",
           "inputs": {"name": "gpu-operator", "namespace": "gpu-operator"}}
CONFIGMAP = {"urn": P + "kubernetes:core/v1:ConfigMap::kept", "type": "kubernetes:core/v1:ConfigMap",
             "inputs": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept", "namespace": "ns"}}}
REPLACEMENT = {"urn": P + "pulumi-python:dynamic/gpu-migration:WorkerReplacement::a-replacement",
               "type": "pulumi-python:dynamic/gpu-migration:WorkerReplacement", "inputs": {}}
APPLIED = [{"manager": "pulumi-kubernetes-0a1b2c3d", "operation": "Apply", "time": "2026-12-03T11:59:00Z"}]
STARTED = NOW - timedelta(minutes=3)  # the killed update's lock


# --- deciding (pure) -----------------------------------------------------------------------------------------------


def test_ids_follow_pulumi_kubernetes():
    assert provider_id(RELEASE) == "gpu-operator/gpu-operator"
    assert provider_id(CONFIGMAP) == "ns/kept"
    assert provider_id({"type": "kubernetes:resource.k8s.io/v1:DeviceClass",
                        "inputs": {"metadata": {"name": "nvidia.com-gpu"}}}) == "nvidia.com-gpu"


def test_nothing_to_import_for_patches_and_dynamic_resources():
    assert provider_id({"type": "kubernetes:core/v1:NodePatch", "inputs": {"metadata": {"name": "10.0.0.1"}}}) is None
    assert provider_id(REPLACEMENT) is None
    assert provider_id({"type": "kubernetes:core/v1:Pod", "inputs": {"metadata": {}}}) is None


def test_only_pending_creates_are_resolved():
    deployment = {"pending_operations": [{"type": "creating", "resource": {"urn": "a"}},
                                         {"type": "updating", "resource": {"urn": "b"}}]}
    assert [r["urn"] for r in pending_creates(deployment)] == ["a"]
    assert pending_creates({}) == []


def test_an_object_is_adopted_only_with_pulumi_kubernetes_field_manager():
    adopted = decide_object(CONFIGMAP, APPLIED + [{"manager": "kubectl", "operation": "Update"}], STARTED, "lock")
    assert (adopted.action, adopted.id, adopted.field_manager, adopted.forced) == \
        ("adopt", "ns/kept", "pulumi-kubernetes-0a1b2c3d", False)
    foreign = decide_object(CONFIGMAP, [{"manager": "kubectl-client-side-apply", "operation": "Update"}], STARTED, "lock")
    assert foreign.forced and foreign.field_manager is None and "kubectl-client-side-apply" in foreign.why
    assert decide_object(CONFIGMAP, None, STARTED, "lock").action == "clear"  # not in the cluster: the next `up` creates it
    assert decide_object(REPLACEMENT, None, STARTED, "lock").action == "clear"
    two = decide_object(CONFIGMAP, APPLIED + [{"manager": "pulumi-kubernetes-99999999", "operation": "Apply",
                                               "time": "2026-12-03T11:00:00Z"}], STARTED, "lock")
    assert two.forced and two.field_manager == "pulumi-kubernetes-0a1b2c3d"  # the newest, with --force
    # An Update by the same name is not a server-side apply; the annotation names the manager when set.
    assert pulumi_managers(CONFIGMAP, [{"manager": "pulumi-kubernetes-0a1b2c3d", "operation": "Update"}]) == []
    # Another Pulumi stack's object: its pulumi-kubernetes manager applied it before the killed update started.
    older = decide_object(CONFIGMAP, APPLIED, NOW, "lock")
    assert older.forced and "another Pulumi stack may have made it" in older.why
    assert decide_object(CONFIGMAP, APPLIED, None, "no lock").forced  # start unknown: can't tell
    annotated = {**CONFIGMAP, "inputs": {"metadata": {"annotations": {"pulumi.com/patchFieldManager": "mine"}}}}
    assert pulumi_managers(annotated, APPLIED + [{"manager": "mine", "operation": "Apply"}]) == ["mine"]


def record(status="deployed", first=NOW, revision=1):
    return HelmRecord(f"sh.helm.release.v1.gpu-operator.v{revision}", revision, status, first)


def test_a_release_is_adopted_only_when_first_deployed_after_the_killed_update_started():
    started = NOW - timedelta(minutes=5)
    ours = decide_release(RELEASE, [record(), record("superseded", NOW, 2)], started, "from its lock file")
    assert (ours.action, ours.id, ours.forced) == ("adopt", "gpu-operator/gpu-operator", False)
    admins = decide_release(RELEASE, [record(first=NOW - timedelta(days=3))], started, "from its lock file")
    assert admins.forced and "before the killed update started" in admins.why
    unknown = decide_release(RELEASE, [record()], None, "the stack has no lock file left")
    assert unknown.forced and "start is unknown (the stack has no lock file left)" in unknown.why
    assert decide_release(RELEASE, [], started, "").action == "clear"


def test_a_killed_install_has_its_records_removed_only_when_this_stack_started_it():
    started = NOW - timedelta(minutes=5)
    stuck = decide_release(RELEASE, [record("pending-install")], started, "")
    assert (stuck.action, stuck.records, stuck.namespace, stuck.forced) == \
        ("remove-records", ("sh.helm.release.v1.gpu-operator.v1",), "gpu-operator", False)
    assert decide_release(RELEASE, [record("pending-install", NOW - timedelta(days=1))], started, "").forced


def test_adopted_creates_join_the_resources_last_with_their_id_and_field_manager_and_the_rest_are_dropped():
    deployment = {"manifest": {"m": 1},
                  "resources": [{"urn": "provider", "id": "p"}],
                  "pending_operations": [
                      {"type": "creating", "resource": {"urn": "release", "inputs": {"name": "r"}}},
                      {"type": "creating", "resource": {"urn": "kept", "inputs": {}}},
                      {"type": "creating", "resource": {"urn": "replacement", "inputs": {}}},
                      {"type": "updating", "resource": {"urn": "provider"}}]}
    steps = [Step("release", "adopt", "", "ns/r"), Step("kept", "adopt", "", "ns/kept", "pulumi-kubernetes-0a1b2c3d"),
             Step("replacement", "clear", "")]
    adopted = adopt_pending(deployment, steps)
    assert adopted["resources"] == [
        {"urn": "provider", "id": "p"},
        {"urn": "release", "inputs": {"name": "r"}, "id": "ns/r", "outputs": {}},
        {"urn": "kept", "inputs": {}, "id": "ns/kept", "outputs": {"__fieldManager": "pulumi-kubernetes-0a1b2c3d"}}]
    assert adopted["pending_operations"] == [] and adopted["manifest"] == {"m": 1}
    assert len(deployment["resources"]) == 1 and len(deployment["pending_operations"]) == 4  # input untouched


def test_adopted_resources_no_refresh_read_are_found():
    resources = [{"urn": "a", "type": "kubernetes:core/v1:ConfigMap", "id": "ns/a",
                  "outputs": {"__fieldManager": "pulumi-kubernetes-0a1b2c3d"}},
                 {"urn": "b", "type": "kubernetes:helm.sh/v3:Release", "id": "ns/b", "outputs": {}},
                 {"urn": "c", "type": "kubernetes:core/v1:ConfigMap", "id": "ns/c",
                  "outputs": {"data": {}, "__fieldManager": "x"}},
                 {"urn": "d", "type": "pulumi:providers:kubernetes", "id": "p", "outputs": {}},
                 {"urn": "e", "type": "pulumi:pulumi:Stack", "outputs": {}}]
    assert never_read({"resources": resources}) == ["a", "b"]


def test_urns_of_another_project_or_stack_are_found():
    mine = {"urn": P + "kubernetes:core/v1:ConfigMap::x", "parent": P + "pulumi:pulumi:Stack::gpu-migration-pilot",
            "provider": P + "pulumi:providers:kubernetes::default::0b0c", "dependencies": [P + "a"]}
    assert foreign_urns({"resources": [mine]}, "pilot") == []
    other = "urn:pulumi:pilot::webshop::kubernetes:core/v1:ConfigMap::x"
    prod = "urn:pulumi:prod::gpu-migration::kubernetes:core/v1:ConfigMap::y"
    assert foreign_urns({"resources": [{**mine, "dependencies": [other]}],
                         "pending_operations": [{"type": "creating", "resource": {"urn": prod}}]}, "pilot") == \
        sorted([other, prod])


def lock(pid=4242, host="here", at=NOW - timedelta(minutes=3)):
    return Lock("/b/.pulumi/locks/organization/gpu-migration/pilot/x.json", pid, "ops", host, at)


def test_a_lock_is_live_only_while_its_process_runs_on_this_host():
    started = (NOW - timedelta(minutes=4)).timestamp()
    assert judge_lock(lock(), "here", Proc(4242, 1, ("pulumi", "up"), "/p", started), NOW, "ops").state == "live"
    assert judge_lock(lock(), "here", None, NOW, "ops").state == "dead"
    reused = judge_lock(lock(), "here", Proc(4242, 1, ("bash",), "/", NOW.timestamp()), NOW, "ops")
    assert reused.state == "dead" and "started after the lock" in reused.why
    other = judge_lock(lock(host="ci-runner-7"), "here", None, NOW, "ops")
    assert other.state == "unknown" and "ops@ci-runner-7 (pid 4242) since 2026-12-03T11:57:00+00:00" in other.why
    # Another user's pid that /proc doesn't show (hidepid) is not a dead one: cancelling needs --force.
    hidden = judge_lock(lock(), "here", None, NOW, "someone-else")
    assert hidden.state == "unknown" and "another user's process" in hidden.why


def test_cancel_is_refused_while_an_update_or_its_processes_run_and_needs_force_where_the_holder_is_unseen():
    dead = judge_lock(lock(), "here", None, NOW, "ops")
    live = judge_lock(lock(), "here", Proc(4242, 1, ("pulumi", "up"), "/p", 0.0), NOW, "ops")
    ok = decide_cancel("file", [dead], [], None, "pilot", True)
    assert ok.cancel and not ok.blockers and not ok.needs_force
    assert not decide_cancel("file", [], [], None, "pilot", True).cancel  # no lock: nothing to cancel
    stopped = decide_cancel("file", [live], [], None, "pilot", True)
    assert not stopped.cancel and "held by a running update" in stopped.blockers[0]
    plugin = Proc(77, 1, ("/x/pulumi-resource-kubernetes",), "/p", 0.0)
    assert "`kill 77`" in decide_cancel("file", [dead], [plugin], None, "pilot", True).blockers[0]
    assert decide_cancel("file", [judge_lock(lock(host="elsewhere"), "here", None, NOW, "ops")], [], None,
                         "pilot", True).needs_force
    assert decide_cancel("file", [dead], [], None, "pilot", False).cancel  # killed between steps: a lock, no ops
    cloud = decide_cancel("cloud", [], [], "2026-12-03T11:57:00.000Z", "pilot", True)
    assert cloud.cancel and "pulumi stack --stack pilot" in cloud.needs_force
    assert not decide_cancel("cloud", [], [], "", "pilot", True).cancel  # Cloud reports no update in progress
    assert decide_cancel("diy", [], [], None, "pilot", True).needs_force
    assert not decide_cancel("diy", [], [], None, "pilot", False).cancel  # no sign of an unfinished update


def test_the_processes_that_count_work_in_the_project_directory_for_this_stack():
    table = {p.pid: p for p in [
        Proc(10, 1, ("/bin/pulumi", "up", "--stack", "pilot"), "/proj", 0.0),
        Proc(11, 10, ("/h/pulumi-resource-kubernetes",), "/proj", 0.0),
        Proc(20, 1, ("/bin/pulumi", "up", "--stack=org/prod"), "/proj", 0.0),  # another stack of the project
        Proc(21, 20, ("python3", "-u", "-m", "pulumi.dynamic", "127.0.0.1:1"), "/proj", 0.0),
        Proc(30, 1, ("python3", "-u", "-m", "pulumi.dynamic", "127.0.0.1:2"), "/proj", 0.0),  # orphaned plugin
        Proc(40, 1, ("/h/pulumi-resource-kubernetes",), "/elsewhere", 0.0),  # another project's
        Proc(50, 1, ("bash",), "/proj", 0.0),  # the operator's shell
        Proc(60, 1, ("/bin/pulumi", "up", "--stack", "pilot"), "/proj", 0.0),  # recover itself (self_pid)
        Proc(70, 2, (), None, 0.0),  # a kernel thread: no command line
        Proc(71, 70, ("/h/pulumi-resource-kubernetes",), "/proj", 0.0)]}
    assert [p.pid for p in project_processes(table, "/proj", "pilot", 60)] == [10, 11, 30, 71]


def test_go_times_and_helm_records_are_read():
    assert parse_time("2026-12-03T11:57:00.123456789+01:00") == datetime(2026, 12, 3, 10, 57, 0, 123456,
                                                                          tzinfo=timezone.utc)
    assert parse_time("2026-12-03T11:57:00Z") == datetime(2026, 12, 3, 11, 57, tzinfo=timezone.utc)
    assert parse_time("yesterday") is None
    helm = base64.b64encode(gzip.compress(json.dumps({"info": {"first_deployed": "x"}}).encode()))
    assert decode_release(base64.b64encode(helm).decode()) == {"info": {"first_deployed": "x"}}


# --- doing, against a stand-in CLI ---------------------------------------------------------------------------------

FAKE = textwrap.dedent("""\
    import json, os, sys
    world = json.load(open(os.environ["FAKE_WORLD"]))
    args = [a for a in sys.argv[1:] if a not in ("--non-interactive",)]
    stdin = sys.stdin.read() if args[:2] == ["stack", "import"] else None
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"args": args, "stdin": stdin}) + "\\n")
    def answer(rc=0, out="", err=""):
        sys.stdout.write(out); sys.stderr.write(err); sys.exit(rc)
    if args[0] == "whoami":
        answer(out=json.dumps({"url": world["url"]}))
    if args[:2] == ["stack", "export"]:
        answer(out=world["export"])
    if args[:2] == ["stack", "history"]:
        answer(out=json.dumps(world.get("history", [])))
    if args[:2] == ["config", "get"]:
        if args[2] in world.get("config", {}):
            answer(out=json.dumps({"value": world["config"][args[2]], "secret": False}))
        answer(255, err=f"error: configuration key '{args[2]}' not found for stack 'pilot'")
    if args[0] == "cancel" and not world.get("rc", {}).get("cancel"):  # the file backend's: every lock file goes
        for name in os.listdir(world["locks"]) if os.path.isdir(world["locks"]) else []:
            os.unlink(os.path.join(world["locks"], name))
    if args[0] in ("cancel", "refresh") or args[:2] == ["stack", "import"]:
        answer(world.get("rc", {}).get(args[0], 0), err=world.get("err", {}).get(args[0], ""))
    answer(2, err="unexpected command")
""")


class World:
    """A project directory, a file backend and the stand-in `pulumi` answering for stack `pilot`."""

    def __init__(self, tmp_path, monkeypatch, deployment, version=4, url=None):
        self.project = tmp_path / "project"
        self.project.mkdir()
        (self.project / "Pulumi.yaml").write_text("name: gpu-migration\nruntime: python\n")
        self.backend = tmp_path / "backend"
        self.export = json.dumps({"version": version, "deployment": deployment}, indent=4)
        self.file, self.log = tmp_path / "world.json", tmp_path / "calls.log"
        self.data = {"url": url or self.backend.as_uri(), "export": self.export,
                     "locks": str(self.backend / ".pulumi/locks/organization/gpu-migration/pilot")}
        self.save()
        self.pulumi = tmp_path / "pulumi"
        self.pulumi.write_text(f"#!{sys.executable}\n{FAKE}")
        self.pulumi.chmod(0o755)
        self.env = {**os.environ, "FAKE_WORLD": str(self.file), "FAKE_LOG": str(self.log)}
        self.kube = FakeCluster.install(monkeypatch)
        monkeypatch.setattr(command, "process_table", dict)  # no process of this host works in this project

    def save(self):
        self.file.write_text(json.dumps(self.data))

    def set(self, **data):
        self.data.update(data)
        self.save()

    def lock(self, pid, host=None, at=None):
        path = self.backend / ".pulumi/locks/organization/gpu-migration/pilot" / f"{uuid.uuid4()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pid": pid, "username": getpass.getuser(), "hostname": host or socket.gethostname(),
                                    "timestamp": (at or datetime.now(timezone.utc)).isoformat()}))
        return path

    def recover(self, cwd=None, **kwargs):
        lines = []
        code = recover(kwargs.pop("stack", "pilot"), str(self.pulumi), self.env, lines.append,
                       cwd=str(cwd or self.project), **kwargs)
        return code, "\n".join(lines)

    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def commands(self):
        return [" ".join(a for a in c["args"][:2] if not a.startswith("-")) for c in self.calls()]


class FakeCluster:
    """Stands in for cluster.Cluster: objects' managedFields and Helm records from dicts; logs what is removed and
    which kubeconfig each read went through (`reads`: (kubeconfig, method))."""
    objects: dict = {}
    records: dict = {}
    removed: list = []
    reads: list = []

    def __init__(self, kubeconfig):
        self.kubeconfig = kubeconfig

    @classmethod
    def install(cls, monkeypatch):
        monkeypatch.setattr(cls, "objects", {}), monkeypatch.setattr(cls, "records", {})
        monkeypatch.setattr(cls, "removed", []), monkeypatch.setattr(cls, "reads", [])
        monkeypatch.setattr(command, "Cluster", cls)
        return cls

    def managed_fields(self, resource, namespace, name):
        self.reads.append((self.kubeconfig, "managed_fields"))
        return self.objects.get(f"{namespace}/{name}" if namespace else name)

    def helm_records(self, namespace, name):
        self.reads.append((self.kubeconfig, "helm_records"))
        return self.records.get(f"{namespace}/{name}", [])

    def remove_records(self, namespace, secrets):
        self.removed.append((namespace, secrets))


def killed_deployment(*pending):
    stack = {"urn": P + "pulumi:pulumi:Stack::gpu-migration-pilot", "type": "pulumi:pulumi:Stack", "custom": False}
    return {"manifest": {}, "resources": [stack],
            "pending_operations": [{"type": "creating", "resource": r} for r in pending]}


@pytest.fixture
def killed(tmp_path, monkeypatch):
    """Stack `pilot` after a killed `up`: a ConfigMap it applied, a release it installed, a replacement it started;
    its CLI's lock left behind (of a process that has ended)."""
    world = World(tmp_path, monkeypatch, killed_deployment(CONFIGMAP, RELEASE, REPLACEMENT))
    ended = subprocess.Popen(["true"])
    ended.wait()
    world.lock_file = world.lock(ended.pid, at=datetime.now(timezone.utc) - timedelta(minutes=2))
    applied = (datetime.now(timezone.utc) - timedelta(minutes=1)).isoformat(timespec="seconds")
    world.kube.objects["ns/kept"] = [{**APPLIED[0], "time": applied}]  # during the killed update
    world.kube.records["gpu-operator/gpu-operator"] = [record(first=datetime.now(timezone.utc) - timedelta(minutes=1))]
    return world


def test_recover_runs_only_in_this_projects_directory(killed, tmp_path):
    code, text = killed.recover(cwd=tmp_path)  # no Pulumi.yaml there
    assert code == 1 and "has no Pulumi.yaml: run recover in the project directory" in text
    other = tmp_path / "webshop"
    other.mkdir()
    (other / "Pulumi.yaml").write_text("name: webshop\nruntime: nodejs\n")
    code, text = killed.recover(cwd=other, yes=True)
    assert code == 1 and "is project 'webshop', not 'gpu-migration'" in text
    code, text = killed.recover(stack="acme/webshop/pilot", yes=True)
    assert code == 1 and "names project 'webshop'" in text
    assert killed.calls() == []  # not even an export


def test_a_state_with_urns_of_another_project_or_stack_is_left_alone(killed, monkeypatch, tmp_path):
    foreign = {**CONFIGMAP, "urn": "urn:pulumi:pilot::webshop::kubernetes:core/v1:ConfigMap::kept"}
    killed.set(export=json.dumps({"version": 3, "deployment": killed_deployment(foreign)}))
    code, text = killed.recover(yes=True, force=True)
    assert code == 1 and "holds URNs of another project or stack (urn:pulumi:pilot::webshop::" in text
    assert killed.commands() == ["whoami", "stack export"] and killed.lock_file.exists()


def test_the_dry_run_shows_the_plan_and_changes_nothing(killed):
    code, text = killed.recover()
    assert code == 0, text
    assert "`pulumi cancel` removes the stack's lock" in text and "that process no longer runs" in text
    assert f"adopt {CONFIGMAP['urn']} as ns/kept: pulumi-kubernetes applied it (field manager " \
           f"pulumi-kubernetes-0a1b2c3d)" in text
    assert f"adopt {RELEASE['urn']} as gpu-operator/gpu-operator: first deployed" in text
    assert f"clear {REPLACEMENT['urn']}: its step resumes" in text
    assert text.endswith("dry run: nothing changed. Run again with --yes to do the above (recover first writes a "
                         "backup of the state).")
    assert killed.commands() == ["whoami", "stack export", "config get", "config get"]  # kubeconfig, chartKubeconfig
    assert killed.lock_file.exists() and not (killed.project / ".recover-backups").exists()


def test_yes_backs_the_whole_export_up_then_cancels_imports_and_refreshes(killed):
    code, text = killed.recover(yes=True)
    assert code == 0, text
    assert killed.commands() == ["whoami", "stack export", "config get", "config get", "cancel", "stack import",
                                 "refresh"]
    [backup] = (killed.project / ".recover-backups").glob("pilot-*.json")
    assert backup.read_text() == killed.export  # the document as exported, its version 4 included
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert stat.S_IMODE(backup.parent.stat().st_mode) == 0o700
    assert (backup.parent / ".gitignore").read_text().splitlines()[-1] == "*"
    assert f"with: pulumi stack import --stack pilot --file {backup}" in text
    imported = json.loads(killed.calls()[5]["stdin"])
    assert imported["version"] == 4 and imported["deployment"]["pending_operations"] == []
    adopted = {r["urn"]: r for r in imported["deployment"]["resources"]}
    assert adopted[CONFIGMAP["urn"]]["outputs"] == {"__fieldManager": "pulumi-kubernetes-0a1b2c3d"}
    assert adopted[RELEASE["urn"]]["id"] == "gpu-operator/gpu-operator" and REPLACEMENT["urn"] not in adopted


def test_an_object_or_release_this_stack_did_not_make_needs_force(killed):
    killed.kube.objects["ns/kept"] = [{"manager": "kubectl-client-side-apply", "operation": "Update"}]
    killed.kube.records["gpu-operator/gpu-operator"] = [record(first=datetime.now(timezone.utc) - timedelta(days=30))]
    code, text = killed.recover(yes=True)
    assert code == 1 and f"2 item(s) above need --force ({CONFIGMAP['urn']}, {RELEASE['urn']})" in text
    assert "cancel" not in killed.commands() and "stack import" not in killed.commands()
    code, text = killed.recover(yes=True, force=True)
    assert code == 0 and "stack import" in killed.commands()


def test_a_killed_install_record_is_removed_before_the_import(killed):
    killed.kube.records["gpu-operator/gpu-operator"] = [record("pending-install", datetime.now(timezone.utc))]
    code, text = killed.recover(yes=True)
    assert code == 0, text
    assert killed.kube.removed == [("gpu-operator", ("sh.helm.release.v1.gpu-operator.v1",))]
    imported = json.loads(killed.calls()[-2]["stdin"])["deployment"]["resources"]
    assert RELEASE["urn"] not in [r["urn"] for r in imported]  # the next `up` installs it again


def test_a_lock_left_without_pending_operations_is_removed_and_no_lock_means_no_cancel(killed):
    """A kill between two steps leaves the lock and no pending operation; the next `up` would fail "the stack is
    currently locked". No state change, so no import and no backup."""
    killed.set(export=json.dumps({"version": 3, "deployment": killed_deployment()}))
    code, text = killed.recover()
    assert code == 0 and "no pending operations" in text and "`pulumi cancel` removes the stack's lock" in text
    assert "cancel" not in killed.commands() and killed.lock_file.exists()
    code, text = killed.recover(yes=True)
    assert code == 0 and "lock removed; run `pulumi up --stack pilot`" in text
    assert killed.commands()[-1] == "cancel" and not killed.lock_file.exists()
    assert not (killed.project / ".recover-backups").exists()
    code, text = killed.recover(yes=True)
    assert code == 0 and "no pending operations and no lock to remove" in text
    assert killed.commands()[-1] == "config get"
    killed.set(export=killed.export)
    code, text = killed.recover(yes=True)  # with no lock, when the killed update started is unknown
    assert code == 1 and "start is unknown (the stack has no lock file left" in text
    code, text = killed.recover(yes=True, force=True)
    assert code == 0 and "no `pulumi cancel`: the stack has no lock" in text
    assert killed.commands()[-2:] == ["stack import", "refresh"] and "cancel" not in killed.commands()[-4:]


@pytest.fixture
def sleeper(tmp_path):
    """A process named like a Pulumi plugin (argv[0] `.../pulumi-resource-test`) working in the project directory."""
    link = tmp_path / "pulumi-resource-test"
    os.symlink(shutil.which("sleep"), link)
    (tmp_path / "project").mkdir(exist_ok=True)
    proc = subprocess.Popen([str(link), "60"], cwd=tmp_path / "project")
    for _ in range(100):  # until it has exec'd (bounded: 10 s)
        found = read_proc(proc.pid)
        if found and found.argv and found.argv[0] == str(link):
            break
        time.sleep(0.1)
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_update_on_this_host_blocks_everything(killed, sleeper, monkeypatch):
    from iks_gpu_migration.cli.recover import processes
    monkeypatch.setattr(command, "process_table", processes.process_table)  # this host's real /proc
    code, text = killed.recover(yes=True, force=True)
    assert code == 1 and f"pid {sleeper.pid} `pulumi-resource-test 60`" in text and f"`kill {sleeper.pid}`" in text
    assert "cancel" not in killed.commands() and "stack import" not in killed.commands()
    # The lock of a process that runs here, taken after it started, is a running update's.
    killed.lock_file.unlink()
    killed.lock(sleeper.pid, at=datetime.now(timezone.utc) + timedelta(seconds=1))
    monkeypatch.setattr(command, "process_table", dict)
    code, text = killed.recover(yes=True, force=True)
    assert code == 1 and f"held by a running update: {getpass.getuser()}@{socket.gethostname()} (pid {sleeper.pid})" in text
    assert "cancel" not in killed.commands() and not (killed.project / ".recover-backups").exists()


def test_a_lock_of_another_host_needs_force(killed):
    killed.lock_file.unlink()
    killed.lock(4242, host="ci-runner-7", at=datetime.now(timezone.utc) - timedelta(minutes=2))
    code, text = killed.recover(yes=True)
    assert code == 1 and "need --force (`pulumi cancel`)" in text and f"{getpass.getuser()}@ci-runner-7 (pid 4242)" in text
    assert "cancel" not in killed.commands()
    assert killed.recover(yes=True, force=True)[0] == 0 and "cancel" in killed.commands()


def test_on_pulumi_cloud_cancel_needs_force_and_the_running_updates_start_dates_the_kill(tmp_path, monkeypatch):
    world = World(tmp_path, monkeypatch, killed_deployment(RELEASE), url="https://api.pulumi.com")
    world.kube.records["gpu-operator/gpu-operator"] = [record(first=datetime(2026, 12, 3, 11, 58, tzinfo=timezone.utc))]
    world.set(history=[{"version": 8, "result": "in-progress", "startTime": "2026-12-03T11:57:00.000Z"},
                       {"version": 7, "result": "succeeded", "startTime": "2026-12-01T09:00:00.000Z"}])
    code, text = world.recover(yes=True)
    assert code == 1 and "on Pulumi Cloud `pulumi cancel` ends whatever update runs on the stack" in text
    assert "first deployed 2026-12-03T11:58:00+00:00, after the killed update started" in text
    assert "cancel" not in world.commands()
    assert world.recover(yes=True, force=True)[0] == 0 and "cancel" in world.commands()
    world.set(history=[{"version": 7, "result": "succeeded", "startTime": "2026-12-01T09:00:00.000Z"}])
    code, text = world.recover()  # nothing in progress: no cancel, no --force, but the release's age is unknown
    assert "no `pulumi cancel`: Pulumi Cloud reports no update in progress" in text and "start is unknown" in text


def test_the_stacks_kubeconfigs_are_read_not_the_ambient_one(killed):
    killed.set(config={"gpu-migration:kubeconfig": "clusters/pilot.yaml"})
    assert killed.recover()[0] == 0
    pilot = str(killed.project / "clusters" / "pilot.yaml")
    assert sorted(killed.kube.reads) == [(pilot, "helm_records"), (pilot, "managed_fields")]
    # The Helm releases' records are read (and removed) as the releases' own identity, when the stack has one.
    killed.kube.reads.clear()
    killed.kube.records["gpu-operator/gpu-operator"] = [record("pending-install", datetime.now(timezone.utc))]
    killed.set(config={"gpu-migration:kubeconfig": "clusters/pilot.yaml",
                       "gpu-migration:chartKubeconfig": "clusters/charts.yaml"})
    assert killed.recover(yes=True)[0] == 0
    charts = str(killed.project / "clusters" / "charts.yaml")
    assert sorted(killed.kube.reads) == [(charts, "helm_records"), (pilot, "managed_fields")]
    assert killed.kube.removed == [("gpu-operator", ("sh.helm.release.v1.gpu-operator.v1",))]
    code, text = killed.recover(kubeconfig="/elsewhere/kubeconfig")
    assert code == 1 and "--kubeconfig /elsewhere/kubeconfig is not the stack's gpu-migration:kubeconfig" in text


def test_a_kubeconfig_under_home_is_expanded_as_the_program_expands_it(killed, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    killed.set(config={"gpu-migration:kubeconfig": "~/.kube/iks.yaml"})
    assert killed.recover()[0] == 0
    home = str(tmp_path / "home" / ".kube" / "iks.yaml")
    assert sorted(killed.kube.reads) == [(home, "helm_records"), (home, "managed_fields")]
    assert killed.recover(kubeconfig=home)[0] == 0  # the same file named in full is the stack's


def test_a_failed_refresh_says_what_to_do_and_the_next_run_finds_and_reads_what_it_left(killed):
    killed.set(rc={"refresh": 1}, err={"refresh": "error: cluster unreachable"})
    code, text = killed.recover(yes=True)
    assert code == 1 and "cluster unreachable" in text and "run recover --yes again, which redoes the refresh" in text
    [backup] = (killed.project / ".recover-backups").glob("pilot-*.json")
    assert f"pulumi stack import --stack pilot --file {backup}" in text.rsplit("put the state back with:", 1)[1]
    # What the import left: the adopted resources with no live state.
    imported = json.loads(killed.calls()[-2]["stdin"])
    killed.set(export=json.dumps(imported), rc={})
    code, text = killed.recover()
    assert code == 0 and "refresh 2 adopted resource(s) never read from the cluster" in text
    assert f"{CONFIGMAP['urn']}, {RELEASE['urn']}" in text and str(backup) in text
    assert killed.commands()[-1] == "config get"  # the dry run changed nothing
    code, text = killed.recover(yes=True)
    assert code == 0 and killed.commands()[-2:] == ["config get", "refresh"] and "adopted resources read" in text
    assert len(list(backup.parent.glob("pilot-*.json"))) == 2  # a new backup before the refresh


def test_an_empty_checkpoint_sidecar_left_by_a_kill_is_removed_only_with_yes(killed):
    """A kill during a file-backend checkpoint write leaves `<stack>.json.attrs` empty (gocloud.dev fileblob writes it
    before renaming the new checkpoint in); `pulumi` then fails with "failed to load checkpoint: EOF"."""
    stacks = killed.backend / ".pulumi" / "stacks" / "gpu-migration"
    stacks.mkdir(parents=True)
    for name, text in [("pilot.json.attrs", ""), ("pilot.json.bak.attrs", '{"md5": "x"}'), ("other.json.attrs", "")]:
        (stacks / name).write_text(text)
    webshop = killed.backend / ".pulumi" / "stacks" / "webshop"  # another project's stack `pilot` in this backend
    webshop.mkdir()
    (webshop / "pilot.json.attrs").write_text("")
    assert broken_sidecars(killed.backend, "pilot") == [stacks / "pilot.json.attrs"]
    code, text = killed.recover()
    assert code == 0 and f"would remove {stacks / 'pilot.json.attrs'}" in text
    assert (stacks / "pilot.json.attrs").exists() and killed.commands() == ["whoami"]
    code, text = killed.recover(yes=True)
    assert code == 0 and f"removed {stacks / 'pilot.json.attrs'}" in text
    assert sorted(p.name for p in stacks.iterdir()) == ["other.json.attrs", "pilot.json.bak.attrs"]
    assert (webshop / "pilot.json.attrs").exists()


def test_lock_files_of_both_layouts_are_read(tmp_path):
    project = tmp_path / ".pulumi" / "locks" / "organization" / "gpu-migration" / "pilot"
    legacy = tmp_path / ".pulumi" / "locks" / "pilot"
    for directory in (project, legacy):
        directory.mkdir(parents=True)
    (project / "a.json").write_text(json.dumps({"pid": 7, "username": "ops", "hostname": "h",
                                                "timestamp": "2026-12-03T11:57:00.5+00:00"}))
    (legacy / "b.json").write_text("{")
    found = read_locks(tmp_path, "pilot")
    assert [(lk.pid, lk.hostname, lk.timestamp) for lk in found] == [
        (7, "h", datetime(2026, 12, 3, 11, 57, 0, 500000, tzinfo=timezone.utc)), (None, "", None)]
    assert judge_lock(found[1], "h", None, NOW, "ops").state == "unknown"  # unreadable: never taken as dead


def test_a_process_is_read_from_proc(sleeper):
    proc = read_proc(sleeper.pid)
    assert proc.argv[0].endswith("pulumi-resource-test") and proc.cwd.endswith("/project")
    assert abs(proc.started - datetime.now(timezone.utc).timestamp()) < 30


def test_the_cluster_reads_managed_fields_and_helm_records_from_a_real_api_server(kube):
    ns = kube.ns("recover")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept", "namespace": ns}, "data": {"v": "1"}}
    kube.core.patch_namespaced_config_map("kept", ns, body, field_manager="pulumi-kubernetes-0a1b2c3d",
                                          _content_type="application/apply-patch+yaml")
    release = base64.b64encode(gzip.compress(json.dumps(
        {"info": {"first_deployed": "2026-12-03T11:58:00.123456789Z"}}).encode())).decode()
    kube.core.create_namespaced_secret(ns, {
        "metadata": {"name": "sh.helm.release.v1.op.v1",
                     "labels": {"owner": "helm", "name": "op", "version": "1", "status": "pending-install"}},
        "type": "helm.sh/release.v1", "data": {"release": base64.b64encode(release.encode()).decode()}})
    cluster = Cluster(kube.kubeconfig)
    kept = {**CONFIGMAP, "inputs": {**CONFIGMAP["inputs"], "metadata": {"name": "kept", "namespace": ns}}}
    assert pulumi_managers(kept, cluster.managed_fields(kept, ns, "kept")) == ["pulumi-kubernetes-0a1b2c3d"]
    assert cluster.managed_fields(kept, ns, "gone") is None
    device_class = {"type": "kubernetes:resource.k8s.io/v1:DeviceClass", "inputs": {}}
    assert cluster.managed_fields(device_class, None, kube.name("none")) is None  # cluster-scoped, not there
    assert cluster.helm_records(ns, "op") == [HelmRecord(
        "sh.helm.release.v1.op.v1", 1, "pending-install", datetime(2026, 12, 3, 11, 58, 0, 123456, tzinfo=timezone.utc))]
    cluster.remove_records(ns, ("sh.helm.release.v1.op.v1",))
    assert cluster.helm_records(ns, "op") == []


def test_an_import_refused_after_the_cancel_says_what_was_done(killed):
    killed.kube.records["gpu-operator/gpu-operator"] = [record("pending-install", datetime.now(timezone.utc))]
    killed.set(rc={"stack": 1}, err={"stack": "error: state file contains errors"})
    code, text = killed.recover(yes=True)
    assert code == 1 and "refused the resolved state; the state is unchanged" in text
    assert "Done before that: removed Helm record(s) sh.helm.release.v1.gpu-operator.v1" in text
    assert "cancelled the killed update" in text and "Run recover again" in text
    assert "refresh" not in killed.commands()


def test_a_bucket_backend_without_pending_operations_does_not_claim_there_is_no_lock(tmp_path, monkeypatch):
    world = World(tmp_path, monkeypatch, {"resources": []}, url="s3://team-state")
    code, text = world.recover()
    assert code == 0 and "doesn't read the bucket's lock files" in text and "no lock to remove" not in text
    assert "pulumi cancel --stack pilot" in text and "cancel" not in world.commands()
