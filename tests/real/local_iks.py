"""The IKS emulator joined to the local control plane: workers become kwok Nodes, as IKS registers them."""
import itertools
import threading
import time
from contextlib import contextmanager
from typing import Optional

from gpu_migration_local.iks_nodes import IksNodeSync
from tests.emulators.iks import IksEmulator


@contextmanager
def local_iks(cluster, nodes: dict[str, str], cluster_name: str = "gpu-local", master: str = "1.35.4_1540",
              worker_version: str = "1.35.4_1540", pools: Optional[dict[str, str]] = None,
              zones: Optional[dict[str, str]] = None):
    """`nodes`: {node name (primary IP): worker ID} of GPU workers at `worker_version` in pool `gpu`, zone
    us-south-1 (or the pool `pools` and the zone `zones` name for the node)."""
    iks = IksEmulator(cluster=cluster_name, master_version=master).start()
    for name, worker_id in nodes.items():
        worker = iks.add_worker(pool_name=(pools or {}).get(name, "gpu"), zone=(zones or {}).get(name, "us-south-1"),
                                worker_id=worker_id, version=worker_version)
        worker["networkInterfaces"][0]["ipAddress"] = name
    # New workers get IP 10.240.0.(n % 250 + 2) from this counter, which IAM tokens draw from too (one per provider
    # process and key, iks/api.py shared_authenticator): from 1020 that is .22 upwards for 230 draws, never a
    # configured name (.11-.13, or the .21 a test names as a typo). From 1000 a scenario's ninth draw was .11, so an
    # extra token (the cluster identity check's) gave a replacement node the name of another entry's node.
    iks._ids = itertools.count(1020)
    sync = IksNodeSync(iks, cluster.api_client, cluster.cache).start()
    try:
        yield iks
    finally:
        sync.stop()
        iks.stop()


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
