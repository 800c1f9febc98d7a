"""This host's processes, read from /proc (Linux): pid, parent, command line, working directory, start time."""
from __future__ import annotations

import os
from typing import Optional

from .holders import Proc


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def read_proc(pid: int, boot: Optional[float] = None) -> Optional[Proc]:
    """One process, or None if it has ended. Its cwd is None when not readable (another user's process)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (FileNotFoundError, ProcessLookupError):
        return None
    if fields[0] == "Z":
        return None  # a zombie has ended; only its exit status waits for its parent
    try:
        cwd: Optional[str] = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    # stat fields after the name: state ppid ... starttime is the 20th (proc(5): field 22 counting pid and name).
    started = (boot if boot is not None else _boot_time()) + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return Proc(pid, int(fields[1]), argv, cwd, started)


def process_table() -> dict[int, Proc]:
    boot, table = _boot_time(), {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                proc = read_proc(int(entry), boot)
            except OSError:
                continue
            if proc is not None:
                table[proc.pid] = proc
    return table
