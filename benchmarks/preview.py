"""`pulumi preview` time against fleet size under the real engine (not a test).

    venv/bin/python benchmarks/preview.py [--checkpoints] [N ...]   # default 100 1000; appends to preview_results.json
    venv/bin/python benchmarks/preview.py [--checkpoints] --split K [--jobs J] N   # N nodes as K stacks

A fresh stack of N device-plugin nodes (maxUnavailable 1: N batches) is previewed by the real Pulumi CLI (Automation
API, file backend) against the local control plane and IKS emulator (tests/real: Project, local_config, local_iks).
Reported: the preview's wall time and the resources it plans.

By default the CLI runs with PULUMI_SKIP_CHECKPOINTS=true, as the README recommends for previews of large fleets: the
file backend gives a preview a SnapshotManager whose persister discards everything, yet it serializes and verifies
the whole in-memory snapshot after every step (pulumi/pulumi pkg/backend/diy/backend.go `DiscardPersister`,
pkg/backend/snapshot.go `defaultServiceLoop`; v3.274.0), which is O(resources) per step. `--checkpoints` measures
the CLI's default.

`--split K`: the fleet as K stacks of N/K nodes, one per worker pool (docs/fleet-scale.md#one-fleet-several-stacks):
the first with the cluster-wide parts, the others `clusterComponents: false`, all sharing one budget; their previews
run J at a time (default 2, the cores here), each in a process of its own. Reported: the wall time until every stack's preview is done, and each
preview's own time.
"""
import pathlib
import sys
import tempfile
import time
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

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


def _preview_stack(engine: tuple, name: str) -> tuple[float, int]:
    from gpu_migration_local.engine import Engine
    stack = Engine(*engine).stack(name)
    started = time.perf_counter()
    result = stack.preview(on_output=lambda line: None)
    return time.perf_counter() - started, sum(result.change_summary.values())


def split_preview_time(n: int, stacks: int, jobs: int, checkpoints: bool) -> dict:
    """N nodes as `stacks` pool stacks sharing one budget, previewed `jobs` at a time, each in a process of its own."""
    per = n // stacks
    with tempfile.TemporaryDirectory() as tmp, LocalCluster() as cluster, \
            local_iks(cluster, {"10.240.0.11": "kube-local0001-gpu-00000101"}) as iks:
        project = Project(pathlib.Path(tmp))
        if not checkpoints:
            project.engine.env["PULUMI_SKIP_CHECKPOINTS"] = "true"
        for s in range(stacks):
            nodes = [{"name": f"10.{s + 1}.{i // 250}.{i % 250 + 1}", "workerId": f"w-{s}-{i:04d}",
                      "stage": "device-plugin"} for i in range(per)]
            project.write_stack(local_config(cluster, iks, nodes, maxUnavailable=max(1, per // 10),
                                             workerPools=[f"gpu-{s}"], clusterComponents=s == 0,
                                             sharedBudget={"name": "fleet", "maxUnavailable": max(1, n // 10)}),
                                f"pool-{s}")
        names = [f"pool-{s}" for s in range(stacks)]
        for name in names:  # created one at a time (workspace files)
            project.stack(name)
        engine = (project.engine.project_dir, project.engine.backend_dir, project.engine.env)
        started = time.perf_counter()
        # One process per preview, as `pulumi preview --stack <pool>` run side by side: each program has its own
        # interpreter, as under the CLI's language host.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            each = list(pool.map(_preview_stack, [engine] * len(names), names))
        wall = time.perf_counter() - started
    return {"nodes": n, "stacks": stacks, "jobs": jobs, "checkpoints": checkpoints, "preview_wall_s": round(wall, 1),
            "per_stack_s": [round(t, 1) for t, _ in each], "planned": sum(p for _, p in each)}


def main() -> int:
    args = sys.argv[1:]
    checkpoints = "--checkpoints" in args
    split = int(args[args.index("--split") + 1]) if "--split" in args else 0
    jobs = int(args[args.index("--jobs") + 1]) if "--jobs" in args else 2
    skip = {i + 1 for flag in ("--split", "--jobs") if flag in args for i in [args.index(flag)]}
    sizes = [int(a) for i, a in enumerate(args) if not a.startswith("--") and i not in skip] or [100, 1000]
    out = ROOT / "benchmarks" / "preview_results.json"
    for n in sizes:
        record(out, (lambda: split_preview_time(n, split, jobs, checkpoints)) if split
               else (lambda: preview_time(n, checkpoints)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
