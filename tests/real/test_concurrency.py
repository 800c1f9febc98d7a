"""Real concurrency under the real Pulumi CLI and engine (issue 20, point 1; issue 36, point 2): a slot per node. With
maxUnavailable k, k nodes move at once, drain and replaceWorker included, and each further node starts as soon as one
of them is done, not when a whole batch is: the slowest node holds its own slot only. Under a `--parallel` just above
the budget (k + 1, below what preview asks for) nothing deadlocks: the nodes waiting for a slot hold no engine step
(components/slots.py). Measured where it matters: the replaceWorker calls the IKS emulator receives, each after its
node's drain in the same provider operation, and when each new worker deploys.

What bounded it before: every gpu-migration:* resource is served by one Python dynamic-provider host process, whose
gRPC server runs `grpc.server(futures.ThreadPoolExecutor(max_workers=4))` (pulumi/pulumi
sdk/python/lib/pulumi/dynamic/__main__.py, `main`); sdk_workarounds.widen_provider_host lifts it in that process. The
engine runs at most `--parallel` steps at once (pkg/resource/deploy/step_executor.go `newStepExecutor`).
"""
import threading
import time

from kubernetes import client

from gpu_migration_local.env import LocalCluster
from iks_gpu_migration.components import rollout

from .kube import eventually
from .local_iks import TimedLog, local_iks
from .project import local_config
from .test_split_fleet import gpu_out

REPLACE_SECONDS = 20.0  # a new worker deploys this long after replaceWorker (IksEmulator.provision_seconds)
SLOW_SECONDS = 90.0  # the first node's replacement takes this long (provision_seconds_for)
SLOTS = 3
NODES = {f"10.240.0.{11 + i}": f"kube-local0001-gpu-{101 + i:08d}" for i in range(8)}


def test_a_slot_per_node_the_slowest_holds_only_its_own_under_parallel_just_above_the_budget(project):
    """8 device-plugin nodes, maxUnavailable 3, the first node's replacement 90 s, the others' 20 s. Preview under a
    small `--parallel` says what to run (once). `up --parallel 4`: the first three go together; every other node's
    replaceWorker goes before the slow node's new worker deploys (a batch barrier would hold nodes 4-6 for it); never
    more than 3 replacements in flight; the run ends near the per-slot ideal, well before three batch rounds."""
    # Each node in a pool of its own: each replacement is its pool and zone's canary, so none waits for another's new
    # worker (one pool and zone's canary: tests/test_canary.py, tests/real/test_stock_out.py).
    pools = {name: f"gpu-{i}" for i, name in enumerate(NODES)}
    slow_node, slow_worker = next(iter(NODES.items()))
    with LocalCluster() as cluster, local_iks(cluster, NODES, pools=pools) as iks:
        iks.requests, iks.provision_seconds = TimedLog(), REPLACE_SECONDS
        iks.provision_seconds_for[slow_worker] = SLOW_SECONDS
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == len(NODES), "eight IKS GPU nodes registered")
        nodes = [{"name": n, "workerId": w, "stage": "device-plugin"} for n, w in NODES.items()]
        timeouts = {"masterUpdate": 60, "workerReplace": 240, "operatorReady": 120, "evict": 60, "pollInterval": 0.2}
        project.write_stack(local_config(cluster, iks, nodes, maxUnavailable=SLOTS, timeouts=timeouts))
        needed = rollout.parallel_needed(SLOTS)
        output: list[str] = []
        project.stack().preview(parallel=2, on_output=output.append)
        # Once, with the number to use: one diagnostic (the progress display repeats its resource row as it changes).
        warnings = [line for line in output if line.strip().startswith(f"warning: run `pulumi up --parallel {needed}`")]
        assert len(warnings) == 1, output

        output.clear()
        peak, stop = [0], threading.Event()

        def watch() -> None:  # GPU nodes out (cordoned, NotReady or gone), as the budget counts them
            while not stop.is_set():
                peak[0] = max(peak[0], gpu_out(core, len(NODES)))
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            result = project.stack().up(parallel=SLOTS + 1, on_output=lambda line: (output.append(line), print(line)))
        finally:
            ended = time.monotonic()
            stop.set()
            watcher.join(5)
        assert result.summary.result == "succeeded"
        starts = iks.requests.at("POST", "/v2/vpc/replaceWorker")
        assert len(starts) == len(NODES), starts  # one replacement per node
        offsets = [round(s - starts[0], 1) for s in starts]
        print(f"replaceWorker offsets {offsets}; done {ended - starts[0]:.1f} s after the first")
        assert peak[0] == SLOTS, peak  # the budget used, never exceeded
        assert max(offsets[:SLOTS]) < REPLACE_SECONDS / 2, offsets  # the first three together
        # Every other node went while the slow one was still replacing: its slot alone was held.
        assert starts[-1] - starts[0] < SLOW_SECONDS, offsets
        # Per-slot ideal: the slow node (90 s) beside two slots that take the 7 others (20 s each): about 90 s of
        # replacements plus each node's steps; three batch rounds would need 90 + 20 + 20 plus theirs.
        assert ended - starts[0] < 2 * SLOW_SECONDS, round(ended - starts[0], 1)
