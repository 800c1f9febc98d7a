"""Every GPU node of the cluster belongs to an entry of gpu-migration:nodes before anything changes (issue 9, point 8),
under the real CLI against the local control plane and the IKS emulator. A stop names the node; an interrupted
replacement still resumes."""

import pytest
from kubernetes import client
from pulumi.automation import CommandError

from .kube import eventually, kwok_node
from .project import local_config, meaningful, planned_changes
from .scenario_env import A, B, C, PILOT_STAGES, WORKERS, interrupted_up, new_name

GPU_FLAVOR = {"ibm-cloud.kubernetes.io/machine-type": "gx3.16x80.l4"}


def failed_up(env, nodes: list[dict]) -> str:
    env.project.write_stack(local_config(env.cluster, env.iks, nodes))
    with pytest.raises(CommandError) as failed:
        env.project.stack().up(on_output=print)
    return str(failed.value)


def assert_nothing_changed(env) -> None:
    assert env.iks.count("PUT", f"/v1/clusters/{env.iks.cluster_name}") == 0
    assert env.iks.count("POST", "/v2/vpc/replaceWorker") == 0
    assert not any((n.metadata.labels or {}).get("nvidia.com/gpu.deploy.operands")
                   for n in env.core.list_node().items)  # no fence, so no operator either
    assert "gpu-operator" not in {ns.metadata.name for ns in env.core.list_namespace().items}


def test_an_unlisted_gpu_node_on_ibm_drivers_stops_up_before_anything_changes(env):
    listed = [{"name": n, "workerId": WORKERS[n], "stage": PILOT_STAGES[n]} for n in (A, B)]
    error = failed_up(env, listed)
    assert f"GPU node {C} (kubelet v1.35.4" in error
    assert "it runs IBM-managed drivers and would get the GPU Operator next to them" in error
    assert f"{{name: {C}, workerId: {WORKERS[C]}, stage: ...}}" in error
    assert_nothing_changed(env)


def test_a_stray_gpu_node_and_a_wrong_name_stop_up_naming_both(env):
    stray = kwok_node("10.240.9.9", {**GPU_FLAVOR, "ibm-cloud.kubernetes.io/worker-pool-name": "other"})
    env.core.create_node(stray)
    nodes = [{"name": n, "workerId": WORKERS[n], "stage": PILOT_STAGES[n]} for n in (A, B, C)]
    nodes[1].update(name="10.240.0.21", workerId="kube-local0001-gpu-00000199")  # typos for B
    error = failed_up(env, nodes)
    assert "GPU node 10.240.9.9 (kubelet v1.37.2" in error and "is not the new worker of a listed node" in error
    assert "node 10.240.0.21 in gpu-migration:nodes (stage device-plugin) matches no node" in error
    assert "no earlier run saw it" in error
    # B itself is unlisted now (its entry has the wrong name) and still on IBM's drivers: named too.
    assert f"GPU node {B} (kubelet v1.35.4" in error
    assert_nothing_changed(env)


def test_up_interrupted_after_the_new_worker_joined_resumes_and_ties_it_to_its_entry(env):
    """SIGINT lets the running replacement finish but starts nothing after it, so A's new node is in the cluster
    but not yet tied to A's entry when the next `up` checks the inventory."""
    env.project.write_stack(env.config(PILOT_STAGES))
    stack = env.project.stack()

    def new_nodes() -> list[str]:
        return [n.metadata.name for n in env.core.list_node().items if n.metadata.name not in WORKERS]

    interrupted_up(stack, new_nodes, "A's new worker registered as a node")
    new = new_nodes()
    # The finishing replacement may already have tied the node to its entry (claims.record_entry); a run killed
    # before that write (or a stack from before it) has not: undo it so the next `up` always meets an untied node.
    eventually(lambda: env.core.read_node(new[0]), "A's new node")
    env.core.patch_node(new[0], {"metadata": {"annotations": {"migration.example.com/gpu-node": None}}})

    lines: list[str] = []
    result = stack.up(on_output=lambda line: (lines.append(line), print(line)))
    assert result.summary.result == "succeeded"
    log = "\n".join(lines)
    assert f"GPU node {new[0]}" in log and f"taken for the new worker of {A}" in log, log
    assert new_name(result, A) == new[0]
    assert env.iks.count("POST", "/v2/vpc/replaceWorker") == 2  # A once, B once
    annotations = client.CoreV1Api(env.cluster.api_client).read_node(new[0]).metadata.annotations
    assert annotations["migration.example.com/gpu-node"] == A
    assert meaningful(planned_changes(stack)) == {}
