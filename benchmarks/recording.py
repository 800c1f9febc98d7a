"""Appending one measured row to a benchmark's JSON results, stamped with when and on what machine it ran."""
import json
import os
import pathlib
import platform
import time
from typing import Any, Callable


def record(out: pathlib.Path, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `measure`, print its row and append it to `out` (a JSON list; read again now, so runs don't overwrite
    each other's rows). The load is read before the measurement."""
    row = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", **measure()}
    print(json.dumps(row), flush=True)
    results = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([*results, row], indent=1) + "\n")
    return row
