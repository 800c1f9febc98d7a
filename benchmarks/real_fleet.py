"""Fleet migration on the path users run (not a test): the real Pulumi CLI and engine, the real Python
dynamic-provider host, the local Kubernetes 1.37 control plane and the IKS emulator, every new worker deploying T
seconds after its replaceWorker.

    venv/bin/python benchmarks/real_fleet.py [--gzip] N:k:T[:G] [...]  # e.g. 50:10:60 20:10:30:20; to real_fleet.json

G (default 1): the GPU nodes spread round-robin over G worker pools (pool and zone groups). In each group the run's
first replacement is the canary (iks/pool_rules.py): the others there wait until its new worker is Ready, so a group
with more than one node in the first batch adds one replacement time T to the run (`limit_with_canary_s`); G = N
(every node a pool of its own) measures the run without that wait, and the two rows together the canary's cost.

The cluster has, as IKS clusters do, a `default` worker pool of CPU workers (DEFAULT_POOL) beside the GPU pool: the
GPU Operator's controllers prefer it (components/charts.py OPERATOR_DEFAULTS), so no batch drains them.

For each run: `pulumi up` of N device-plugin nodes with maxUnavailable k (ceil(N/k) batches) under
`--parallel k + 8` (what preview asks for), and reported:
- the wall time from the first replaceWorker request to the end of `up`, against the limit ceil(N/k)*T;
- the most replaceWorker requests in flight together (each holds its node out for T);
- where each batch's time beyond T goes (`per_batch_s`, averages: StepTimes.per_batch);
- the bytes the file backend wrote during the whole `up` (every state file it saved, counted when it lands, with
  inotify: the diy backend writes each checkpoint whole through gocloud.dev's fileblob, a temporary file renamed into
  place), the number of saves (state file landings; each also writes a .bak and two .attrs), and the final
  state's size and resources per node.
"""
import ctypes
import ctypes.util
import math
import os
import pathlib
import select
import struct
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.recording import record  # noqa: E402
from gpu_migration_local.env import LocalCluster  # noqa: E402
from iks_gpu_migration.components import rollout  # noqa: E402
from tests.real.local_iks import TimedLog, local_iks, overlap  # noqa: E402
from tests.real.project import Project, local_config  # noqa: E402

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE, IN_ISDIR = 0x8, 0x80, 0x100, 0x40000000
DEFAULT_POOL = ("default", "bx2.4x16", 2)  # name, CPU flavor, workers
STATE_FILE = "local.json"  # the stack's checkpoint in the file backend (with --gzip: .json.gz)


class WrittenBytes:
    """Sums the size of every file that lands under `root` (closed after writing or renamed into place), as the file
    backend saves state, by inotify; temporary files count once renamed, not when closed."""

    def __init__(self, root: pathlib.Path) -> None:
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK)
        self.dirs: dict[int, pathlib.Path] = {}
        self.bytes = 0
        self.by_name: dict[str, int] = {}  # landings per file name
        self.stopped = threading.Event()
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            self._watch(d)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _watch(self, d: pathlib.Path) -> None:
        wd = self.libc.inotify_add_watch(self.fd, str(d).encode(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE)
        self.dirs[wd] = d

    def _read(self) -> None:
        while not self.stopped.is_set():
            if not select.select([self.fd], [], [], 0.1)[0]:
                continue
            data = os.read(self.fd, 1 << 16)
            i = 0
            while i < len(data):
                wd, mask, _, length = struct.unpack_from("iIII", data, i)
                name = data[i + 16:i + 16 + length].rstrip(b"\0").decode()
                i += 16 + length
                path = self.dirs.get(wd, pathlib.Path("/nonexistent")) / name
                if mask & IN_CREATE and mask & IN_ISDIR:
                    self._watch(path)
                elif mask & (IN_CLOSE_WRITE | IN_MOVED_TO) and not name.endswith(".tmp"):
                    try:
                        self.bytes += path.stat().st_size
                        self.by_name[name] = self.by_name.get(name, 0) + 1
                    except FileNotFoundError:
                        pass

    def stop(self) -> None:
        time.sleep(0.2)
        self.stopped.set()
        self.thread.join()
        os.close(self.fd)


class StepTimes:
    """When each step of the `up` started and ended (engine events), to tell where a batch's time beyond T goes."""

    def __init__(self) -> None:
        self.pre: dict[str, float] = {}
        self.out: dict[str, float] = {}

    def __call__(self, event) -> None:
        for kind, seen in (("pre", event.resource_pre_event), ("out", event.res_outputs_event)):
            if seen is not None:
                getattr(self, kind).setdefault(seen.metadata.urn.rsplit("::", 1)[-1], time.monotonic())

    def per_batch(self, requests: list[float], k: int, t: float) -> dict[str, float]:
        """Averages over the batches, in seconds: gate -> the batch's first replaceWorker (master reading, pool
        rules, budget, the drains); first -> last replaceWorker (the batch-mates, drained beside the canary, wait for
        its new worker); last new worker deployed (last replaceWorker + T) -> the batch's last switch done (the
        worker's healthy readings, then the GPU Operator's operands on the new node); that -> the next gate."""
        requests, switches = sorted(requests), sorted(v for n, v in self.out.items() if n.endswith("-switch"))
        gates = [self.pre[g] for g in sorted((g for g in self.pre if g.endswith("-gate")),
                                             key=lambda g: int(g.split("-")[1]))]
        phases: dict[str, list[float]] = {"gate_to_first_request": [], "request_spread": [],
                                          "deployed_to_batch_done": [], "batch_done_to_next_gate": []}
        for i, gate in enumerate(gates):
            batch, done = requests[i * k:(i + 1) * k], switches[i * k:(i + 1) * k]
            if not batch or not done:
                continue
            phases["gate_to_first_request"].append(batch[0] - gate)
            phases["request_spread"].append(batch[-1] - batch[0])
            phases["deployed_to_batch_done"].append(done[-1] - (batch[-1] + t))
            if i + 1 < len(gates):
                phases["batch_done_to_next_gate"].append(gates[i + 1] - done[-1])
        return {name: round(sum(v) / len(v), 2) for name, v in phases.items() if v}


def add_default_pool(iks) -> None:
    name, flavor, size = DEFAULT_POOL
    iks.add_pool(name, flavor=flavor)
    for i in range(size):
        worker = iks.add_worker(pool_name=name, worker_id=f"kube-local0001-{name}-{i + 1:08d}")
        worker["networkInterfaces"][0]["ipAddress"] = f"10.242.0.{i + 1}"


def run(n: int, k: int, t: float, gzip: bool = False, groups: int = 1) -> dict:
    names = {f"10.241.{i // 250}.{i % 250 + 1}": f"kube-local0001-gpu-{i + 1:08d}" for i in range(n)}
    pools = {name: f"gpu-{i % groups}" if groups > 1 else "gpu" for i, name in enumerate(names)}
    with tempfile.TemporaryDirectory() as tmp, LocalCluster() as cluster, \
            local_iks(cluster, names, pools=pools) as iks:
        add_default_pool(iks)
        iks.ip_of = lambda i: f"10.250.{i // 250}.{i % 250 + 2}"  # unique for any fleet
        iks.requests, iks.provision_seconds = TimedLog(), t
        project = Project(pathlib.Path(tmp))
        if gzip:  # the DIY backends' own compression (pulumi/pulumi sdk/go/common/env: PULUMI_DIY_BACKEND_GZIP)
            project.engine.env["PULUMI_DIY_BACKEND_GZIP"] = "true"
        nodes = [{"name": name, "workerId": w, "stage": "device-plugin"} for name, w in names.items()]
        timeouts = {"masterUpdate": 120, "workerReplace": 4 * t + 600, "operatorReady": 1800, "evict": 120,
                    "capacityGate": 600, "pollInterval": 0.5}
        project.write_stack(local_config(cluster, iks, nodes, maxUnavailable=k, timeouts=timeouts))
        stack = project.stack()
        written = WrittenBytes(pathlib.Path(tmp) / "backend")
        steps = StepTimes()
        started = time.monotonic()
        result = stack.up(parallel=rollout.parallel_needed(k), on_output=lambda line: None, on_event=steps)
        ended = time.monotonic()
        written.stop()
        assert result.summary.result == "succeeded", result.summary
        starts = iks.requests.at("POST", "/v2/vpc/replaceWorker")
        assert len(starts) == n, (len(starts), n)
        deployment = stack.export_stack().deployment
        state = sum(p.stat().st_size for p in (pathlib.Path(tmp) / "backend").rglob(STATE_FILE + (".gz" * gzip)))
    limit = math.ceil(n / k) * t
    first_batch = list(names)[:k]
    canary_waits = any(sum(pools[m] == pools[name] for m in first_batch) > 1 for name in first_batch)
    wall = ended - starts[0]
    return {"nodes": n, "max_unavailable": k, "cpu_workers": DEFAULT_POOL[2], "replace_seconds": t, "parallel": rollout.parallel_needed(k),
            "up_wall_s": round(ended - started, 1), "from_first_replace_s": round(wall, 1), "limit_s": limit,
            "over_limit_pct": round(100 * (wall - limit) / limit, 1), "most_in_flight": overlap(starts, t),
            "pool_zone_groups": groups, "limit_with_canary_s": limit + t * canary_waits,
            "backend_gzip": gzip, "backend_bytes_written": written.bytes,
            "backend_saves": written.by_name.get(STATE_FILE + (".gz" * gzip), 0),
            "backend_files_written": sum(written.by_name.values()),
            "files_written": dict(sorted(written.by_name.items(), key=lambda kv: -kv[1])[:4]),
            "final_state_bytes": state, "resources": len(deployment["resources"]),
            "state_bytes_per_node": round(state / n), "per_batch_s": steps.per_batch(starts, k, t)}


def main() -> int:
    gzip = "--gzip" in sys.argv[1:]
    runs = [tuple(float(x) for x in a.split(":")) for a in sys.argv[1:] if a != "--gzip"] or [(50, 10, 60.0)]
    for n, k, t, *g in runs:
        groups = int(g[0]) if g else 1
        record(ROOT / "benchmarks" / "real_fleet.json", lambda: run(int(n), int(k), t, gzip, groups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
