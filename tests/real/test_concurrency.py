"""Real concurrency of a batch under the real Pulumi CLI and engine (issue 11, point 3): a batch of k nodes with
budget k replaces its workers at once, up to the dynamic-provider host's 4 operations, and `pulumi up --parallel`
bounds it further. Measured where it matters: the replaceWorker calls the IKS emulator receives.

Why 4: every gpu-migration:* resource is served by one Python dynamic-provider host process, whose gRPC server runs
`grpc.server(futures.ThreadPoolExecutor(max_workers=4))` (pulumi/pulumi sdk/python/lib/pulumi/dynamic/__main__.py,
`main`); the engine runs at most `--parallel` steps at once (pkg/resource/deploy/step_executor.go `newStepExecutor` starts `DegreeOfParallelism()` workers).
"""
import threading
import time

from kubernetes import client

from gpu_migration_local.env import LocalCluster

from .kube import eventually
from .local_iks import local_iks
from .project import local_config

REPLACE_SECONDS = 15.0  # every new worker deploys this long after replaceWorker (IksEmulator.provision_seconds)
NODES = {f"10.240.0.{11 + i}": f"kube-local0001-gpu-{101 + i:08d}" for i in range(5)}


class TimedLog(list):
    """The emulator's request log, with the arrival time of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.lock = threading.Lock()

    def append(self, item) -> None:
        with self.lock:
            self.times.append(time.monotonic())
            super().append(item)

    def at(self, method: str, path: str) -> list[float]:
        return [t for t, r in zip(self.times, self) if r == (method, path)]


def overlap(starts: list[float], hold: float) -> int:
    """Most replacements in flight at once: each holds its provider operation for at least `hold` seconds after its
    replaceWorker call (until its new worker deploys), so calls less than `hold` apart ran together."""
    return max(sum(1 for s in starts if t - hold < s <= t) for t in starts)


def up_one_batch(project, parallel=None) -> tuple[list[float], list[str]]:
    """`pulumi up` of five device-plugin nodes with maxUnavailable 5 (one batch); the replaceWorker call times and
    the engine's output."""
    with LocalCluster() as cluster, local_iks(cluster, NODES) as iks:
        iks.requests = TimedLog()
        iks.provision_seconds = REPLACE_SECONDS
        core = client.CoreV1Api(cluster.api_client)
        eventually(lambda: len(core.list_node().items) == len(NODES), "five IKS GPU nodes registered")
        nodes = [{"name": n, "workerId": w, "stage": "device-plugin"} for n, w in NODES.items()]
        timeouts = {"masterUpdate": 60, "workerReplace": 120, "operatorReady": 120, "evict": 60, "pollInterval": 0.2}
        project.write_stack(local_config(cluster, iks, nodes, maxUnavailable=5, timeouts=timeouts))
        output: list[str] = []
        kwargs = {"parallel": parallel} if parallel else {}
        result = project.stack().up(on_output=lambda line: (output.append(line), print(line)), **kwargs)
        assert result.summary.result == "succeeded"
        starts = iks.requests.at("POST", "/v2/vpc/replaceWorker")
        assert len(starts) == len(NODES), starts  # one replacement per node
        return starts, output


def test_a_batch_replaces_its_workers_concurrently_up_to_the_provider_hosts_four(project):
    starts, output = up_one_batch(project)
    # Four at once, not one after another and not five: the fifth waits for a free provider-host thread.
    assert overlap(starts, REPLACE_SECONDS) == 4, [round(s - starts[0], 1) for s in starts]
    assert any("at most 4 provider operations at once" in line for line in output)  # preview and up say so


def test_up_parallel_bounds_the_batch_further(project):
    starts, _ = up_one_batch(project, parallel=2)
    assert overlap(starts, REPLACE_SECONDS) == 2, [round(s - starts[0], 1) for s in starts]
