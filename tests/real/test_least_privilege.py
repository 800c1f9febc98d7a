"""The whole local migration under the real CLI with the shipped RBAC (iks_gpu_migration/rbac/) and nothing more: the
program runs as a ServiceAccount bound to the ClusterRole gpu-migration, the Helm releases as one bound to
gpu-migration-charts (gpu-migration:chartKubeconfig), `status` as one bound to gpu-migration-status. The local API
server enforces RBAC (--authorization-mode RBAC). One cluster for all of it, so the proof costs one scenario."""
import json
import subprocess
import sys

import pytest
from kubernetes import client, config as kconfig
from kubernetes.client.exceptions import ApiException
from pulumi.automation import CommandError

from iks_gpu_migration.kube.refusals import status_message

from .identities import apply, kubeconfig_for, manifest, without
from .project import REPO
from .scenario_env import A, B, C, PILOT, PLUGIN, new_name

NS = "gpu-migration"  # where the manifests put the ServiceAccounts
STAGES = {A: "dra", B: "ibm-managed", C: "ibm-managed"}  # fence, operator, master, replace, switch, smoke
ROLLBACK = {**STAGES, A: "device-plugin"}  # the rollback check; the DRA path and its release are removed


def identities(env, tmp_path, program_role_edit=None) -> dict[str, str]:
    api = env.cluster.api_client
    apply(api, manifest("gpu-migration", program_role_edit))
    apply(api, manifest("gpu-migration-charts"))
    apply(api, manifest("gpu-migration-status"))
    admin = env.cluster.kubeconfig
    return {who: kubeconfig_for(api, admin, NS, sa, tmp_path / f"{who}.kubeconfig")
            for who, sa in (("program", "gpu-migration"), ("charts", "gpu-migration-charts"),
                            ("status", "gpu-migration-status"))}


def test_the_whole_migration_runs_with_the_shipped_roles_and_a_missing_rule_stops_it_first(env, tmp_path):
    # The shipped role minus `patch` on nodes: `up` stops before anything changes, naming the verb and resource.
    kube = identities(env, tmp_path, without("nodes", "patch"))
    as_shipped = {"kubeconfig": kube["program"], "chartKubeconfig": kube["charts"]}
    env.project.write_stack(env.config(STAGES, **as_shipped))
    with pytest.raises(CommandError) as stopped:
        env.project.stack().up(on_output=print)
    message = str(stopped.value)
    assert ('cannot patch resource "nodes" in API group "" at the cluster scope' in message
            and "User 'system:serviceaccount:gpu-migration:gpu-migration'" in message
            and "nothing was changed" in message and "gpu-migration.yaml" in message), message[-3000:]
    assert not [r for r in env.iks.requests if r[0] != "GET" and r[1] != "/identity/token"], env.iks.requests
    assert "nvidia.com/gpu.deploy.operands" not in env.node(C).metadata.labels
    assert not client.CoreV1Api(env.cluster.api_client).list_namespaced_secret(
        "gpu-operator", label_selector="owner=helm").items

    # The role as shipped: the whole migration, then a rollback of the dra node (its check pod, the DRA path removed).
    apply(env.cluster.api_client, manifest("gpu-migration"))
    result, _ = env.up(STAGES, **as_shipped)
    new_a = new_name(result, A)
    assert result.outputs[f"node:{A}"].value["smokeTest"].startswith("passed")
    assert env.node(new_a).metadata.labels[PILOT] == "pilot"
    assert env.node(C).metadata.labels["nvidia.com/gpu.deploy.operands"] == "false"
    env.up(ROLLBACK, **as_shipped)
    assert PILOT not in env.node(new_a).metadata.labels and env.node(new_a).metadata.labels[PLUGIN] == "true"
    assert env.record(new_a)["path"] == "device-plugin" and env.record(new_a)["result"] == "passed"
    assert not client.CoreV1Api(env.cluster.api_client).list_namespaced_secret(
        "nvidia-dra-driver-gpu", label_selector="owner=helm,name=dra-driver").items  # uninstalled by the chart role

    # `status` reads with its read-only identity, which may not write.
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({k: v.value for k, v in env.project.stack().outputs().items()}))
    shown = subprocess.run([sys.executable, "-m", "iks_gpu_migration.cli.status", "--stack", "local", "--json",
                            "--kubeconfig", kube["status"], "--outputs", str(outputs),
                            "--project-dir", str(env.project.dir)], capture_output=True, text=True, cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    nodes = json.loads(shown.stdout)["nodes"]
    assert {n["node"] for n in nodes} == {new_a, B, C} and all(n["found"] for n in nodes), shown.stdout
    with kconfig.new_client_from_config(kube["status"]) as api, pytest.raises(ApiException) as refused:
        client.CoreV1Api(api).patch_node(B, {"metadata": {"labels": {"x": "y"}}})
    assert refused.value.status == 403 and 'cannot patch resource "nodes"' in status_message(refused.value)
