"""The whole local migration under the real CLI with the shipped RBAC (iks_gpu_migration/rbac/) and nothing more: the
program runs as a ServiceAccount bound to the roles of gpu-migration.yaml (the ClusterRole gpu-migration and the smoke
namespace's Role gpu-migration-smoke), the Helm releases as one bound to gpu-migration-charts
(gpu-migration:chartKubeconfig), `status` as one bound to gpu-migration-status. The local API server enforces RBAC
(--authorization-mode RBAC) and writes an audit log of the program's and the charts' requests: not one of them may
be answered 403 (a refused watch only slows the waits down, so nothing else would show it). One cluster for all of
it, so the proof costs one scenario."""
import functools
import json
import subprocess
import sys
from collections import Counter

import pytest
from kubernetes import client, config as kconfig
from kubernetes.client.exceptions import ApiException
from pulumi.automation import CommandError

from gpu_migration_local import env as local_env
from gpu_migration_local.control_plane import ControlPlane
from iks_gpu_migration.kube.refusals import status_message

from .identities import apply, kubeconfig_for, manifest, without
from .project import REPO
from .scenario_env import A, B, C, PILOT, PILOT_STAGES, PLUGIN, new_name, three_workers

NS = "gpu-migration"  # where the manifests put the ServiceAccounts
PROGRAM, CHARTS = (f"system:serviceaccount:{NS}:{sa}" for sa in ("gpu-migration", "gpu-migration-charts"))
# Every request of the two identities, once, with its answer (stage ResponseComplete; a watch's when it ends).
AUDIT = {"omitStages": ["RequestReceived", "ResponseStarted"],
         "rules": [{"level": "Metadata", "users": [PROGRAM, CHARTS]}, {"level": "None"}]}
STAGES = PILOT_STAGES  # A dra, B device-plugin, C ibm-managed: fence, operator, master, replacements, switch, smoke
ROLLBACK = {**STAGES, A: "device-plugin"}  # the rollback check; the DRA path and its release are removed


@pytest.fixture
def audited(project, monkeypatch):
    """The scenario's cluster (tests/real/scenario_env.py) with the API server's audit log of both identities."""
    monkeypatch.setattr(local_env, "ControlPlane", functools.partial(ControlPlane, audit_policy=AUDIT))
    yield from three_workers(project)


def identities(env, tmp_path, program_edit=None, charts_edit=None) -> dict[str, str]:
    api = env.cluster.api_client
    apply(api, manifest("gpu-migration", program_edit))
    apply(api, manifest("gpu-migration-charts", charts_edit))
    apply(api, manifest("gpu-migration-status"))
    admin = env.cluster.kubeconfig
    return {who: kubeconfig_for(api, admin, NS, sa, tmp_path / f"{who}.kubeconfig")
            for who, sa in (("program", "gpu-migration"), ("charts", "gpu-migration-charts"),
                            ("status", "gpu-migration-status"))}


def answered(cluster) -> list[dict]:
    """The audit events (one per request) of the program's and the charts' identities."""
    lines = cluster.control_plane.audit_log.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def summary(event: dict) -> str:
    ref = event.get("objectRef") or {}
    return (f"{event['user']['username']} {event['verb']} {ref.get('apiGroup', '')}/{ref.get('resource')}"
            f"{'/' + ref['subresource'] if ref.get('subresource') else ''} ns={ref.get('namespace', '')} "
            f"name={ref.get('name', '')}")


def test_the_whole_migration_runs_with_the_shipped_roles_and_a_missing_rule_stops_it_first(audited, tmp_path):
    env = audited
    # The shipped roles minus `patch` on nodes and the chart role minus `escalate`: `up` stops before anything
    # changes, naming both.
    kube = identities(env, tmp_path, without("nodes", "patch"),
                      without("clusterroles", "escalate", "gpu-migration-charts"))
    as_shipped = {"kubeconfig": kube["program"], "chartKubeconfig": kube["charts"]}
    env.project.write_stack(env.config(STAGES, **as_shipped))
    with pytest.raises(CommandError) as stopped:
        env.project.stack().up(on_output=print)
    message = str(stopped.value)
    assert ('cannot patch resource "nodes" in API group "" at the cluster scope' in message
            and f"User '{PROGRAM}'" in message and "nothing was changed" in message
            and "gpu-migration.yaml" in message), message[-3000:]
    assert (f"the identity of gpu-migration:chartKubeconfig (User '{CHARTS}')" in message
            and 'cannot escalate resource "clusterroles" in API group "rbac.authorization.k8s.io"' in message
            and "gpu-migration-charts.yaml" in message), message[-3000:]
    assert not [r for r in env.iks.requests if r[0] != "GET" and r[1] != "/identity/token"], env.iks.requests
    assert "nvidia.com/gpu.deploy.operands" not in env.node(C).metadata.labels
    assert not client.CoreV1Api(env.cluster.api_client).list_namespaced_secret(
        "gpu-operator", label_selector="owner=helm").items

    # The roles as shipped: the whole migration (a device-plugin and a dra node), then a rollback of the dra node
    # (its check pod, the DRA path removed: the smoke namespace, the program's DeviceClass, the DRA driver's release).
    identities(env, tmp_path)
    result, _ = env.up(STAGES, **as_shipped)
    new_a, new_b = new_name(result, A), new_name(result, B)
    assert result.outputs[f"node:{A}"].value["smokeTest"].startswith("passed")
    assert env.node(new_a).metadata.labels[PILOT] == "pilot"
    assert env.node(new_b).metadata.labels[PLUGIN] == "true" and PILOT not in env.node(new_b).metadata.labels
    assert env.node(C).metadata.labels["nvidia.com/gpu.deploy.operands"] == "false"
    env.up(ROLLBACK, **as_shipped)
    assert PILOT not in env.node(new_a).metadata.labels and env.node(new_a).metadata.labels[PLUGIN] == "true"
    assert env.record(new_a)["path"] == "device-plugin" and env.record(new_a)["result"] == "passed"
    assert not client.CoreV1Api(env.cluster.api_client).list_namespaced_secret(
        "nvidia-dra-driver-gpu", label_selector="owner=helm,name=dra-driver").items  # uninstalled by the chart role

    # Not one request of either identity was refused, watches included; and the log holds what the run did.
    events = answered(env.cluster)
    refused = [summary(e) for e in events if (e.get("responseStatus") or {}).get("code") == 403]
    assert not refused, "\n".join(sorted(Counter(refused)))
    done = Counter((e["user"]["username"], e["verb"], (e.get("objectRef") or {}).get("resource")) for e in events
                   if (e.get("responseStatus") or {}).get("code", 0) < 300)
    for wanted in [(PROGRAM, "watch", "nodes"), (PROGRAM, "watch", "resourceslices"), (PROGRAM, "watch", "pods"),
                   (PROGRAM, "create", "pods"), (PROGRAM, "delete", "namespaces"), (PROGRAM, "delete", "deviceclasses"),
                   (PROGRAM, "patch", "nodes"), (CHARTS, "create", "clusterroles"), (CHARTS, "create", "secrets")]:
        assert done[wanted], (wanted, sorted(done))
    # The log would show a refusal: the program's identity may not create a pod outside the smoke namespace.
    with kconfig.new_client_from_config(kube["program"]) as api, pytest.raises(ApiException):
        client.CoreV1Api(api).create_namespaced_pod("default", {"metadata": {"name": "probe"}, "spec": {
            "containers": [{"name": "c", "image": "busybox"}]}})
    probe = [e for e in answered(env.cluster)[len(events):] if (e.get("responseStatus") or {}).get("code") == 403]
    assert [(e["user"]["username"], e["verb"], e["objectRef"]["resource"], e["objectRef"]["namespace"])
            for e in probe] == [(PROGRAM, "create", "pods", "default")], [summary(e) for e in probe]

    # `status` reads with its read-only identity, which may not write.
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({k: v.value for k, v in env.project.stack().outputs().items()}))
    shown = subprocess.run([sys.executable, "-m", "iks_gpu_migration.cli.status", "--stack", "local", "--json",
                            "--kubeconfig", kube["status"], "--outputs", str(outputs),
                            "--project-dir", str(env.project.dir)], capture_output=True, text=True, cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    nodes = json.loads(shown.stdout)["nodes"]
    assert {n["node"] for n in nodes} == {new_a, new_b, C} and all(n["found"] for n in nodes), shown.stdout
    with kconfig.new_client_from_config(kube["status"]) as api, pytest.raises(ApiException) as refused_patch:
        client.CoreV1Api(api).patch_node(C, {"metadata": {"labels": {"x": "y"}}})
    assert refused_patch.value.status == 403 and 'cannot patch resource "nodes"' in status_message(refused_patch.value)
