"""One fleet, two stacks (issue 20, point 5): one stack per worker pool over one cluster, under the real CLI, their
`up`s run at once. The stack of pool gpu-a has the cluster-wide parts (master, GPU Operator); the stack of gpu-b
fences its nodes, then waits for them. Both share one budget of 2 nodes (a Lease of the cluster): each stack's batch
is 2 nodes, so the two batches go out one after the other, never together, whoever starts first.

Measured where it matters: the replaceWorker calls the IKS emulator receives, each held out until its new worker
deploys (REPLACE_SECONDS after it)."""
import contextlib
import os
import re
import signal
import threading
import time

from kubernetes import client

from gpu_migration_local.env import LocalCluster
from iks_gpu_migration.kube.shared_budget import CLAIMS_ANNOTATION, lease_name

from .kube import eventually
from .local_iks import TimedLog, local_iks, overlap
from .project import local_config
from .scenario_env import cli_processes, descendants, processes

REPLACE_SECONDS = 12.0
POOLS = {"10.240.0.11": "gpu-a", "10.240.0.12": "gpu-a", "10.240.0.13": "gpu-b", "10.240.0.14": "gpu-b"}
# A batch's two nodes in two zones of their pool: each is its pool and zone's canary, none waits for the other's new
# worker (iks/pool_rules.py), so a batch's requests go together.
ZONES = {"10.240.0.11": "us-south-1", "10.240.0.12": "us-south-2", "10.240.0.13": "us-south-1",
         "10.240.0.14": "us-south-2"}
NODES = {name: f"kube-local0001-gpu-{101 + i:08d}" for i, name in enumerate(POOLS)}
BUDGET = {"name": "fleet", "maxUnavailable": 2}


def stack_config(cluster, iks, pool: str, **extra) -> dict:
    nodes = [{"name": n, "workerId": w, "stage": "device-plugin"} for n, w in NODES.items() if POOLS[n] == pool]
    timeouts = {"masterUpdate": 120, "workerReplace": 120, "operatorReady": 120, "evict": 60, "capacityGate": 120,
                "pollInterval": 0.2}
    return local_config(cluster, iks, nodes, **{"maxUnavailable": 2, "timeouts": timeouts, "workerPools": [pool],
                                                "sharedBudget": BUDGET, **extra})


def test_two_stacks_of_one_cluster_never_have_more_out_than_their_shared_budget(project):
    with LocalCluster() as cluster, local_iks(cluster, NODES, pools=POOLS, zones=ZONES) as iks:
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
        # The second stack's gate waited while the first's batch was out ("3 of 2" or "4 of 2", as its nodes went).
        assert re.search(r"shared budget 'fleet': [34] of 2 node\(s\) out with this batch of 2", text), text[-3000:]
        assert "every GPU node on IBM's drivers is fenced, in every worker pool" in text
        lease = client.CoordinationV1Api(cluster.api_client).read_namespaced_lease(lease_name("fleet"),
                                                                                   "gpu-migration")
        assert lease.metadata.annotations[CLAIMS_ANNOTATION] == "{}"  # both released their last batch
        # A second `up` of each changes nothing in the cluster and takes no claim.
        for name, stack in stacks.items():
            again = stack.preview(on_output=lambda line: None)
            assert not {k for k, v in again.change_summary.items() if k not in ("same", "update") and v}, name


def gpu_out(core: client.CoreV1Api, fleet: int) -> int:
    """GPU nodes of the fleet out now: the fleet's size minus its GPU nodes Ready and schedulable (a node cordoned,
    NotReady, or gone and not back yet is out)."""
    up = 0
    for node in core.list_node(label_selector="ibm-cloud.kubernetes.io/gpu-enabled=true").items:
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        up += ready and not node.spec.unschedulable
    return fleet - up


def stack_cli(stack: str) -> list[int]:
    """PIDs of this test's `pulumi up` of `stack` (the Automation API passes --stack)."""
    return [pid for pid in cli_processes() if stack.encode() in b" ".join(processes()[pid][1])]


def test_a_killed_stack_never_lets_the_fleet_exceed_its_shared_budget_and_both_converge(project):
    """Issue 36, point 5: two stacks, one shared budget of 2. The first stack whose batch sends its replaceWorker calls
    is SIGKILLed right then: its claim stays in the Lease, its nodes are out (old workers deleted, new ones joining).
    The other stack's batch goes only once the killed stack's nodes are back (counted from the cluster, not from the
    stale claim, which names nodes that are gone); a watcher sees at most 2 GPU nodes out at any moment. The killed
    stack's next `up` (after `recover`) converges and drops its stale claim."""
    from .test_killed_up_recovery import run_recover
    with LocalCluster() as cluster, local_iks(cluster, NODES, pools=POOLS, zones=ZONES) as iks:
        iks.provision_seconds = REPLACE_SECONDS
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == len(NODES), "four IKS GPU nodes registered")
        core.create_namespace({"metadata": {"name": "gpu-migration"}})
        budget = {**BUDGET, "claimTtl": 30}
        project.write_stack(stack_config(cluster, iks, "gpu-a", sharedBudget=budget), "pool-a")
        project.write_stack(stack_config(cluster, iks, "gpu-b", clusterComponents=False, sharedBudget=budget),
                            "pool-b")
        stacks = {name: project.stack(name) for name in ("pool-a", "pool-b")}
        workers = {"pool-a": {NODES[n] for n in NODES if POOLS[n] == "gpu-a"},
                   "pool-b": {NODES[n] for n in NODES if POOLS[n] == "gpu-b"}}
        results: dict[str, object] = {}
        peak, stop = [0], threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], gpu_out(core, len(NODES)))
                time.sleep(0.1)

        def up(name: str) -> None:
            try:
                results[name] = stacks[name].up(parallel=16, on_output=lambda line: print(f"[{name}] {line}",
                                                                                          flush=True))
            except Exception as e:  # noqa: BLE001 - asserted below
                results[name] = e

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        threads = {name: threading.Thread(target=up, args=(name,)) for name in stacks}
        for t in threads.values():
            t.start()
        killed = eventually(lambda: next((s for s, w in workers.items() if w <= set(iks.replaced)), None),
                            "a stack's two replaceWorker calls", timeout=300, interval=0.05)
        plugins = [p for pid in stack_cli(killed) for p in descendants(pid)]
        for pid in stack_cli(killed):
            os.kill(pid, signal.SIGKILL)
        survivor = next(s for s in stacks if s != killed)
        threads[killed].join(60)
        threads[survivor].join(600)
        for pid in plugins:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert getattr(results[survivor], "summary", None) and results[survivor].summary.result == "succeeded", \
            results[survivor]
        assert len(iks.replaced) == 4, iks.replace_log  # the survivor's batch went: the killed stack's were back
        code, text = run_recover(project, killed, yes=True)
        assert code == 0, text
        assert stacks[killed].up(parallel=16, on_output=print).summary.result == "succeeded"
        stop.set()
        watcher.join(5)
        assert peak[0] <= BUDGET["maxUnavailable"], peak  # never more out than the shared budget
        assert len(iks.replaced) == 4  # the resumed stack followed its replacements, replaced nothing again
        lease = client.CoordinationV1Api(cluster.api_client).read_namespaced_lease(lease_name("fleet"),
                                                                                   "gpu-migration")
        assert lease.metadata.annotations[CLAIMS_ANNOTATION] == "{}"  # both released their last batch
