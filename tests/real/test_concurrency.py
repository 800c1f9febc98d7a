"""Real concurrency of a batch under the real Pulumi CLI and engine (issue 20, point 1): a batch of k nodes with
budget k moves its k nodes at once, drain and replaceWorker included, under the `--parallel` the program asks for
(batch size + 8; rollout.parallel_needed); with less, preview and up say what to run. Measured where it matters: the
replaceWorker calls the IKS emulator receives, each after its node's drain in the same provider operation.

What bounded it before: every gpu-migration:* resource is served by one Python dynamic-provider host process, whose
gRPC server runs `grpc.server(futures.ThreadPoolExecutor(max_workers=4))` (pulumi/pulumi
sdk/python/lib/pulumi/dynamic/__main__.py, `main`); sdk_workarounds.widen_provider_host lifts it in that process. The
engine runs at most `--parallel` steps at once (pkg/resource/deploy/step_executor.go `newStepExecutor`).
"""
import time

from kubernetes import client

from gpu_migration_local.env import LocalCluster
from iks_gpu_migration.components import rollout

from .kube import eventually
from .local_iks import TimedLog, local_iks, overlap
from .project import local_config

REPLACE_SECONDS = 30.0  # every new worker deploys this long after replaceWorker (IksEmulator.provision_seconds)
NODES = {f"10.240.0.{11 + i}": f"kube-local0001-gpu-{101 + i:08d}" for i in range(8)}


def test_a_batch_of_eight_moves_its_eight_nodes_at_once(project):
    """8 device-plugin nodes, maxUnavailable 8 (one batch): a preview under a smaller `--parallel` says what to run;
    `up` with it sends all 8 replaceWorker requests (each after its node's drain) within one provisioning delay, and
    the batch ends about one delay after the first: the 8 provider operations waited together, not in two rounds."""
    # Each node in a pool of its own: each replacement is its pool and zone's canary, so none waits for another's new
    # worker (one pool and zone's canary: tests/test_canary.py, tests/real/test_stock_out.py).
    pools = {name: f"gpu-{i}" for i, name in enumerate(NODES)}
    with LocalCluster() as cluster, local_iks(cluster, NODES, pools=pools) as iks:
        iks.requests = TimedLog()
        iks.provision_seconds = REPLACE_SECONDS
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == len(NODES), "eight IKS GPU nodes registered")
        nodes = [{"name": n, "workerId": w, "stage": "device-plugin"} for n, w in NODES.items()]
        timeouts = {"masterUpdate": 60, "workerReplace": 120, "operatorReady": 120, "evict": 60, "pollInterval": 0.2}
        project.write_stack(local_config(cluster, iks, nodes, maxUnavailable=len(NODES), timeouts=timeouts))
        needed = rollout.parallel_needed(len(NODES))
        output: list[str] = []
        project.stack().preview(parallel=4, on_output=output.append)
        assert any(f"Run `pulumi up --parallel {needed}`" in line for line in output), output

        output.clear()
        result = project.stack().up(parallel=needed, on_output=lambda line: (output.append(line), print(line)))
        ended = time.monotonic()
        assert result.summary.result == "succeeded"
        assert not any("pulumi up --parallel" in line for line in output)  # enough: no warning
        starts = iks.requests.at("POST", "/v2/vpc/replaceWorker")
        assert len(starts) == len(NODES), starts  # one replacement per node
        offsets = [round(s - starts[0], 1) for s in starts]
        assert overlap(starts, REPLACE_SECONDS) == len(NODES), offsets
        assert max(offsets) < REPLACE_SECONDS / 2, offsets  # one round, not two
        # The batch's replacements, switches, readiness and pending-pod checks end within two delays of the first
        # replaceWorker: two rounds of replacements would need more than two (the second round's workers deploy a full
        # delay after the first round's).
        print(f"replaceWorker offsets {offsets}; batch done {ended - starts[0]:.1f} s after the first")
        assert ended - starts[0] < 2 * REPLACE_SECONDS, round(ended - starts[0], 1)
