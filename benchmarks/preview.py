"""`pulumi preview` time against fleet size under the real engine (not a test).

    venv/bin/python benchmarks/preview.py [--checkpoints] [N ...]   # default 100 1000; appends to preview_results.json

A fresh stack of N device-plugin nodes (maxUnavailable 1: N batches) is previewed by the real Pulumi CLI (Automation
API, file backend) against the local control plane and IKS emulator (tests/real: Project, local_config, local_iks).
Reported: the preview's wall time and the resources it plans.

By default the CLI runs with PULUMI_SKIP_CHECKPOINTS=true, as the README recommends for previews of large fleets: the
file backend gives a preview a SnapshotManager whose persister discards everything, yet it serializes and verifies
the whole in-memory snapshot after every step (pulumi/pulumi pkg/backend/diy/backend.go `DiscardPersister`,
pkg/backend/snapshot.go `defaultServiceLoop`; v3.274.0), which is O(resources) per step. `--checkpoints` measures
the CLI's default.
"""
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.recording import record  # noqa: E402
from gpu_migration_local.env import LocalCluster  # noqa: E402
from tests.real.local_iks import local_iks  # noqa: E402
from tests.real.project import Project, local_config  # noqa: E402


def preview_time(n: int, checkpoints: bool) -> dict:
    nodes = [{"name": f"10.1.{i // 250}.{i % 250 + 1}", "workerId": f"w-{i:04d}", "stage": "device-plugin"}
             for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp, LocalCluster() as cluster, \
            local_iks(cluster, {"10.240.0.11": "kube-local0001-gpu-00000101"}) as iks:
        project = Project(pathlib.Path(tmp))
        if not checkpoints:
            project.engine.env["PULUMI_SKIP_CHECKPOINTS"] = "true"
        project.write_stack(local_config(cluster, iks, nodes, maxUnavailable=1))
        stack = project.stack()
        started = time.perf_counter()
        result = stack.preview(on_output=lambda line: None)
        wall = time.perf_counter() - started
    return {"nodes": n, "checkpoints": checkpoints, "preview_wall_s": round(wall, 1),
            "planned": sum(result.change_summary.values())}


def main() -> int:
    checkpoints = "--checkpoints" in sys.argv[1:]
    sizes = [int(a) for a in sys.argv[1:] if a != "--checkpoints"] or [100, 1000]
    for n in sizes:
        record(ROOT / "benchmarks" / "preview_results.json", lambda: preview_time(n, checkpoints))
    return 0


if __name__ == "__main__":
    sys.exit(main())
