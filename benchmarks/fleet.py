"""Fleet-scale benchmark (not a test): migration wall time against its limit, and program time against fleet size.

    venv/bin/python benchmarks/fleet.py [--quick]      # writes benchmarks/results.json and benchmarks/results.md

1. Wall time: `pulumi up` of N device-plugin nodes under budget k (tests/fleet_up.py: the program under mocks, real
   WorkerReplacement and CapacityGate providers against the IKS and Kubernetes emulators, every replacement taking
   T seconds), against the limit ceil(N/k)*T; overhead per node = (wall - limit) / N. Under mocks, with provider
   concurrency unbounded: NOT the path users run (the real CLI, engine and provider host: benchmarks/real_fleet.py).
2. Program time: declaring N nodes under the mocks harness (tests/harness.py), each N in a fresh process: the
   declaration alone (wall and CPU) and the whole process (imports, config, declaration), for N = 10, 100, 1000.
"""
import argparse
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PROGRAM_TIME = """
import sys, time
started = time.perf_counter()
sys.path[:0] = [{root!r}, {tests!r}]
from test_fleet_graph import fleet_config
from harness import run_program
n = {n}
t, c = time.perf_counter(), time.process_time()
run = run_program(fleet_config(n))
print(n, time.perf_counter() - t, time.process_time() - c, time.perf_counter() - started, len(run.registered),
      sum(len(d) for d in run.dependencies.values()))
"""


def program_time(n: int) -> dict:
    code = PROGRAM_TIME.format(root=str(ROOT), tests=str(ROOT / "tests"), n=n)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    process = time.perf_counter() - started
    _, wall, cpu, _in_process, resources, edges = out.stdout.split()[-6:]
    return {"nodes": n, "declare_wall_s": round(float(wall), 2), "declare_cpu_s": round(float(cpu), 2),
            "process_wall_s": round(process, 2), "resources": int(resources), "dependency_edges": int(edges)}


def wall_time(n: int, k: int, t: float, host_workers) -> dict:
    from fleet_up import fleet_up

    with tempfile.TemporaryDirectory() as tmp:
        run = fleet_up(n, str(k), replace_seconds=t, tmp_dir=pathlib.Path(tmp), host_workers=host_workers,
                       poll_interval=0.02)
    if run.error is not None:
        raise RuntimeError(f"fleet up N={n} k={k} failed: {run.error}")
    limit = math.ceil(n / k) * t
    first_gate = next(c.at for c in run.timeline.changes if c.event == "gate opened")
    return {"nodes": n, "max_unavailable": k, "replace_seconds": t, "host_workers": host_workers or "unbounded",
            "wall_s": round(run.wall, 2), "limit_s": limit, "over_limit_pct": round(100 * (run.wall - limit) / limit, 1),
            "overhead_per_node_s": round((run.wall - limit) / n, 3), "until_first_gate_s": round(first_gate, 2),
            "max_unavailable_seen": run.timeline.max_unavailable()}


def markdown(results: dict) -> str:
    lines = [f"# Fleet benchmark ({results['when']}, {results['machine']})", "",
             "## Migration wall time against ceil(N/k)·T, under mocks (not the path users run: real_fleet.py)", "",
             "| N | k | T (s) | provider workers | wall (s) | limit (s) | over limit | overhead/node (s) | "
             "until 1st gate (s) | max unavailable seen |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["wall_time"]:
        lines.append(f"| {r['nodes']} | {r['max_unavailable']} | {r['replace_seconds']:g} | {r['host_workers']} | "
                     f"{r['wall_s']} | {r['limit_s']:g} | {r['over_limit_pct']}% | {r['overhead_per_node_s']} | "
                     f"{r['until_first_gate_s']} | {r['max_unavailable_seen']} |")
    lines += ["", "## Program time (declaration under mocks, maxUnavailable 1) against N", "",
              "| N | resources | dependency edges | declare wall (s) | declare CPU (s) | whole process (s) |",
              "|---|---|---|---|---|---|"]
    for r in results["program_time"]:
        lines.append(f"| {r['nodes']} | {r['resources']} | {r['dependency_edges']} | {r['declare_wall_s']} | "
                     f"{r['declare_cpu_s']} | {r['process_wall_s']} |")
    ratio = results.get("ratio_1000_over_100")
    if ratio:
        lines += ["", f"1000 over 100 nodes: declare wall {ratio['declare_wall']}x, declare CPU {ratio['declare_cpu']}x, "
                      f"whole process {ratio['process_wall']}x (before: 500 nodes 216 s, 1000 nodes RecursionError)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small T and no 1000-node run (a smoke check)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks")
    args = parser.parse_args()
    t = 2.0 if args.quick else 30.0
    results = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
               "wall_time": [], "program_time": []}
    results["wall_time"].append(wall_time(50, 5, t, None))
    print(json.dumps(results["wall_time"], indent=1), flush=True)
    for n in (10, 100) if args.quick else (10, 100, 1000):
        results["program_time"].append(program_time(n))
        print(json.dumps(results["program_time"][-1]), flush=True)
    by_n = {r["nodes"]: r for r in results["program_time"]}
    if 1000 in by_n:
        results["ratio_1000_over_100"] = {
            key.removesuffix("_s"): round(by_n[1000][key] / by_n[100][key], 1)
            for key in ("declare_wall_s", "declare_cpu_s", "process_wall_s")}
    args.out.mkdir(exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
