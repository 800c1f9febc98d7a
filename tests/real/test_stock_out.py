"""A GPU flavor out of stock mid-batch (issue 36, point 1), under the real CLI, the real control plane and the real
GPU Operator: in pool gpu, zone us-south-1, every new worker ends in `provision_failed` (IKS's state for a flavor
without capacity: ibm-cloud-docs worker-node-state-reference). Four slots: three nodes there and one of pool gpu-b
start together. Only the canary's worker is lost; the others there keep their old workers and are uncordoned again;
gpu-b's node is replaced and, under `pulumi up --continue-on-error` (the engine then runs every step that does not
depend on the failed one: Pulumi's "Continue on Error in the Pulumi CLI", pulumi/docs content/blog/continue-on-error),
brought to its stage."""
import pytest
from kubernetes import client
from pulumi.automation import CommandError

from gpu_migration_local.env import LocalCluster

from .kube import eventually
from .local_iks import local_iks
from .project import local_config

SAME = {f"10.240.0.{11 + i}": f"kube-local0001-gpu-{101 + i:08d}" for i in range(3)}
OTHER = {"10.240.0.14": "kube-local0001-gpu-b-00000104"}
MESSAGE = "Insufficient capacity for flavor gx3.16x80.l4 in zone us-south-1"


def test_a_stock_out_costs_only_the_canarys_node_and_other_pools_go_on(project):
    nodes = {**SAME, **OTHER}
    with LocalCluster() as cluster, local_iks(cluster, nodes, pools={n: "gpu-b" for n in OTHER}) as iks:
        iks.fail_new_workers = ("provision_failed", MESSAGE)
        iks.fail_new_workers_in = {("gpu", "us-south-1")}
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == len(nodes), "four IKS GPU nodes registered")
        config = [{"name": n, "workerId": w, "stage": "device-plugin"} for n, w in nodes.items()]
        timeouts = {"masterUpdate": 60, "workerReplace": 120, "operatorReady": 120, "evict": 60, "pollInterval": 0.2}
        project.write_stack(local_config(cluster, iks, config, maxUnavailable=len(nodes), timeouts=timeouts))
        output: list[str] = []
        with pytest.raises(CommandError) as failed:
            project.stack().up(parallel=16, continue_on_error=True,
                               on_output=lambda line: (output.append(line), print(line)))
        text = "\n".join(output) + str(failed.value)

        requested = [w for w in iks.replaced if w in SAME.values()]
        assert len(requested) == 1, iks.replace_log  # the canary alone in pool gpu, zone us-south-1
        (canary,) = requested
        assert "provision_failed" in text and MESSAGE in text, text[-4000:]
        for name, worker in SAME.items():
            if worker == canary:
                continue
            assert iks.workers[worker]["lifecycle"]["actualState"] == "deployed"  # its old worker is kept
            assert not core.read_node(name).spec.unschedulable, name  # drained beside the canary, uncordoned again
            assert f"worker {worker} of cluster" in text and "was not replaced" in text
        # The other pool went on: its node was replaced and reached its stage (its switch step: the operator's
        # device plugin offers its GPUs); no node of the failed pool and zone got that far.
        assert OTHER["10.240.0.14"] in iks.replaced
        new = [w for w in iks.workers.values() if w["poolName"] == "gpu-b" and w["id"] not in OTHER.values()]
        assert len(new) == 1 and new[0]["lifecycle"]["actualState"] == "deployed", new
        done = {r["urn"].rsplit("::", 1)[1] for r in project.stack().export_stack().deployment["resources"]}
        assert "10.240.0.14-switch" in done and not {f"{n}-switch" for n in SAME} & done, sorted(done)
