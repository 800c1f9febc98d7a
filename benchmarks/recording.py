"""Appending one measured row to a benchmark's JSON results, stamped with when and on what machine it ran."""
import json
import os
import pathlib
import platform
import subprocess
import time
from typing import Any, Callable


def code_version(repo: pathlib.Path) -> str:
    """The commit measured, `+changes` when the tree differs from it (read before the measurement starts)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    # The recorded results themselves (benchmarks/*.json) change with every row: not a change of the code.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/*.json")
    return head + ("+changes" if changed else "")


def record(out: pathlib.Path, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `measure`, print its row and append it to `out` (a JSON list; read again now, so runs don't overwrite
    each other's rows). The load and the code's commit are read before the measurement."""
    row = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
           "code": code_version(out.resolve().parents[1])}
    row.update(measure())
    print(json.dumps(row), flush=True)
    results = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([*results, row], indent=1) + "\n")
    return row
