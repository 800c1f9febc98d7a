"""One fleet, two stacks (issue 20, point 5): one stack per worker pool over one cluster, under the real CLI, their
`up`s run at once. The stack of pool gpu-a has the cluster-wide parts (master, GPU Operator); the stack of gpu-b
fences its nodes, then waits for them. Both share one budget of 2 nodes (a Lease of the cluster): each stack's batch
is 2 nodes, so the two batches go out one after the other, never together, whoever starts first.

Measured where it matters: the replaceWorker calls the IKS emulator receives, each held out until its new worker
deploys (REPLACE_SECONDS after it)."""
import threading
import time

from kubernetes import client

from gpu_migration_local.env import LocalCluster
from iks_gpu_migration.kube.shared_budget import CLAIMS_ANNOTATION, lease_name

from .kube import eventually
from .local_iks import TimedLog, local_iks, overlap
from .project import local_config

REPLACE_SECONDS = 12.0
POOLS = {"10.240.0.11": "gpu-a", "10.240.0.12": "gpu-a", "10.240.0.13": "gpu-b", "10.240.0.14": "gpu-b"}
NODES = {name: f"kube-local0001-gpu-{101 + i:08d}" for i, name in enumerate(POOLS)}
BUDGET = {"name": "fleet", "maxUnavailable": 2}


def stack_config(cluster, iks, pool: str, **extra) -> dict:
    nodes = [{"name": n, "workerId": w, "stage": "device-plugin"} for n, w in NODES.items() if POOLS[n] == pool]
    timeouts = {"masterUpdate": 120, "workerReplace": 120, "operatorReady": 120, "evict": 60, "capacityGate": 120,
                "pollInterval": 0.2}
    return local_config(cluster, iks, nodes, maxUnavailable=2, timeouts=timeouts, workerPools=[pool],
                        sharedBudget=BUDGET, **extra)


def test_two_stacks_of_one_cluster_never_have_more_out_than_their_shared_budget(project):
    with LocalCluster() as cluster, local_iks(cluster, NODES, pools=POOLS) as iks:
        iks.requests = TimedLog()
        iks.provision_seconds = REPLACE_SECONDS
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == len(NODES), "four IKS GPU nodes registered")
        core.create_namespace({"metadata": {"name": "gpu-migration"}})  # rbac/gpu-migration.yaml makes it on IKS
        project.write_stack(stack_config(cluster, iks, "gpu-a"), "pool-a")
        project.write_stack(stack_config(cluster, iks, "gpu-b", clusterComponents=False), "pool-b")
        stacks = {name: project.stack(name) for name in ("pool-a", "pool-b")}
        outputs: dict[str, list[str]] = {name: [] for name in stacks}
        results: dict[str, object] = {}

        def up(name: str) -> None:
            try:
                results[name] = stacks[name].up(parallel=16, on_output=lambda line: (
                    outputs[name].append(line), print(f"[{name}] {line}", flush=True)))
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                results[name] = e

        threads = [threading.Thread(target=up, args=(name,)) for name in ("pool-b", "pool-a")]
        for t in threads:
            t.start()
            time.sleep(1)
        for t in threads:
            t.join(timeout=600)
        assert all(getattr(r, "summary", None) and r.summary.result == "succeeded" for r in results.values()), results

        starts = iks.requests.at("POST", "/v2/vpc/replaceWorker")
        offsets = [round(s - starts[0], 1) for s in starts]
        print(f"replaceWorker offsets {offsets}")
        assert len(starts) == 4, offsets  # one per node
        assert overlap(starts, REPLACE_SECONDS) == 2, offsets  # each batch of 2 at once, the two batches never together
        assert offsets[2] >= REPLACE_SECONDS, offsets
        # The pool stack waited for the cluster-wide parts; one stack's gate waited for the other's batch.
        text = "\n".join(outputs["pool-a"] + outputs["pool-b"])
        assert "2 of 2 node(s) out by other stacks" in text, text[-3000:]
        assert "every GPU node on IBM's drivers is fenced, in every worker pool" in text
        lease = client.CoordinationV1Api(cluster.api_client).read_namespaced_lease(lease_name("fleet"),
                                                                                   "gpu-migration")
        assert lease.metadata.annotations[CLAIMS_ANNOTATION] == "{}"  # both released their last batch
        # A second `up` of each changes nothing in the cluster and takes no claim.
        for name, stack in stacks.items():
            again = stack.preview(on_output=lambda line: None)
            assert not {k for k, v in again.change_summary.items() if k not in ("same", "update") and v}, name
