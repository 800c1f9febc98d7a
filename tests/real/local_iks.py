"""The IKS emulator joined to the local control plane: workers become kwok Nodes, as IKS registers them."""
import itertools
from contextlib import contextmanager

from gpu_migration_local.iks_nodes import IksNodeSync
from tests.emulators.iks import IksEmulator


@contextmanager
def local_iks(cluster, nodes: dict[str, str], cluster_name: str = "gpu-local", master: str = "1.35.4_1540",
              worker_version: str = "1.35.4_1540"):
    """`nodes`: {node name (primary IP): worker ID} of GPU workers at `worker_version` in pool `gpu`."""
    iks = IksEmulator(cluster=cluster_name, master_version=master).start()
    for name, worker_id in nodes.items():
        worker = iks.add_worker(pool_name="gpu", worker_id=worker_id, version=worker_version)
        worker["networkInterfaces"][0]["ipAddress"] = name
    iks._ids = itertools.count(1000)  # replacements get IPs that are never a configured name
    sync = IksNodeSync(iks, cluster.api_client).start()
    try:
        yield iks
    finally:
        sync.stop()
        iks.stop()
