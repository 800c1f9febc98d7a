"""The drain before a worker replacement under the real Pulumi CLI and engine (issue 17): on a node that runs a
Deployment guarded by a PodDisruptionBudget, a bare pod and a pod with emptyDir data, `up` stops before anything is
evicted, naming both pods and the opt-ins; opted in, `up` completes, and the Deployment never had fewer ready pods than
its budget allows (the real disruption controller computes it; kwok runs the pods; the real scheduler places them)."""

import pytest
from kubernetes import client
from pulumi.automation import CommandError

from .kube import ReadyReplicas, eventually
from .scenario_env import A, B, C, WORKERS

STAGES = {A: "device-plugin", B: "ibm-managed", C: "ibm-managed"}  # only A's worker is replaced
REPLACE = "/v2/vpc/replaceWorker"
POOL = {"ibm-cloud.kubernetes.io/worker-pool-name": "gpu"}


def workloads(env) -> str:
    """web (2 replicas, PDB minAvailable 1), cache (emptyDir) and a bare notebook, all on A; returns cache's pod."""
    core, apps = env.core, client.AppsV1Api(env.cluster.api_client)
    core.create_namespace({"metadata": {"name": "ml"}})
    for other in (B, C):  # the Deployments' pods start on A; afterwards they may go anywhere in the pool
        core.patch_node(other, {"spec": {"unschedulable": True}})
    for name, replicas, volumes in (("web", 2, []), ("cache", 1, [{"name": "scratch", "emptyDir": {}}])):
        apps.create_namespaced_deployment("ml", {"metadata": {"name": name}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "nodeSelector": POOL, "volumes": volumes, "containers": [{"name": "c", "image": "img"}]}}}})
        eventually(lambda: (apps.read_namespaced_deployment(name, "ml").status.ready_replicas or 0) == replicas,
                   f"{name} ready on {A}")
    core.create_namespaced_pod("ml", {"metadata": {"name": "notebook"}, "spec": {
        "nodeName": A, "containers": [{"name": "c", "image": "img"}]}})
    client.PolicyV1Api(env.cluster.api_client).create_namespaced_pod_disruption_budget("ml", {
        "metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    for other in (B, C):
        core.patch_node(other, {"spec": {"unschedulable": None}})
    eventually(lambda: client.PolicyV1Api(env.cluster.api_client).read_namespaced_pod_disruption_budget(
        "web", "ml").status.disruptions_allowed == 1, "the disruption controller computed web's budget")
    return next(p.metadata.name for p in core.list_namespaced_pod("ml", label_selector="app=cache").items)


def test_up_refuses_to_lose_a_bare_pod_or_emptydir_data_then_drains_within_the_budget_once_opted_in(env):
    cache = workloads(env)
    env.project.write_stack(env.config(STAGES))
    with pytest.raises(CommandError) as failed:
        env.project.stack().up(on_output=print)
    message = str(failed.value)
    assert "ml/notebook: declares no controller" in message and "drain.force: true" in message, message
    assert f"ml/{cache}: emptyDir volume scratch would lose its data" in message
    assert "drain.deleteEmptyDirData: true" in message and "Nothing was evicted" in message
    pods = env.core.list_namespaced_pod("ml").items
    assert len(pods) == 4 and all(p.spec.node_name == A and not p.metadata.deletion_timestamp for p in pods)
    assert env.iks.count("POST", REPLACE) == 0 and not env.node(A).spec.unschedulable  # its cordon undone

    with ReadyReplicas(env.cluster.api_client, "ml", "web") as ready:
        result, _ = env.up(STAGES, drain={"force": True, "deleteEmptyDirData": True})
    assert min(ready.seen) >= 1, ready.seen  # never below what the budget allows
    drained = result.outputs[f"node:{A}"].value["drained"]
    assert "ml/notebook" in drained["evicted"] and f"ml/{cache}" in drained["evicted"]
    assert len([p for p in drained["evicted"] if p.startswith("ml/web-")]) == 2
    assert env.iks.count("POST", REPLACE) == 1
    assert env.iks.workers[WORKERS[A]]["lifecycle"]["actualState"] == "deleted"
