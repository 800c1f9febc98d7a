"""What the real nodes change on the host, recorded before each change and undone in reverse on stop; a run that was
killed leaves its record, and the next start undoes it (`undo_leftovers`).

A node's own mount namespace takes most of it away (node.py: /run, /var/lib and /var/log are the namespace's own, so
the kubelet's and containerd's fixed paths never reach the host); what stays global is recorded here: processes
(by PID and start time, so a reused PID is never signalled), cgroup directories in every hierarchy (the node's
cgroupRoot; its processes are killed through them, the containers' with the shims'), network links (the node's
bridge and the pods' veths on it) and sysctls (`net.ipv4.ip_forward`, which the CNI bridge plugin turns on for a
gateway bridge: plugins/main/bridge/bridge.go; the nodes' bridges are no gateways, and it is put back if it moved).
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None if it is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def cgroup_mounts() -> list[pathlib.Path]:
    """Every cgroup hierarchy's mount point (v1 controllers, named ones, and the unified v2 one), from mountinfo."""
    out = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        if right.split()[0] in ("cgroup", "cgroup2"):
            out.append(pathlib.Path(left.split()[4]))
    return out


def cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for mount in cgroup_mounts():
        for procs in (mount / name).rglob("cgroup.procs") if (mount / name).is_dir() else ():
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except OSError:
                pass
    return pids


def kill_cgroup(name: str, timeout: float = 15.0) -> None:
    """SIGKILL every process under the cgroup `name` in any hierarchy until none is left, then remove its
    directories, deepest first."""
    deadline = time.monotonic() + timeout
    while pids := cgroup_pids(name):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {sorted(pids)} of cgroup /{name} still there after {timeout:.0f} s")
        time.sleep(0.1)
    for mount in cgroup_mounts():
        root = mount / name
        if root.is_dir():
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                d.rmdir()
            root.rmdir()


def make_cgroup(name: str) -> None:
    """`name` and `name/runtime` in every hierarchy (the kubelet wants its cgroupRoot in each, else "cgroup [...]
    has some missing paths"); a new v1 cpuset cgroup has no CPUs or memory nodes until given its parent's."""
    for mount in cgroup_mounts():
        for d in (mount / name, mount / name / "runtime"):
            d.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (d / f).exists() and not (d / f).read_text().strip():
                    (d / f).write_text((d.parent / f).read_text())


def join_cgroup(name: str) -> None:
    """Moves the calling process into `name/runtime` in every hierarchy (a child's preexec_fn: what it starts stays
    there, so a stop finds it)."""
    for mount in cgroup_mounts():
        (mount / name / "runtime" / "cgroup.procs").write_text(str(os.getpid()))


def delete_link(name: str) -> None:
    """A bridge and every link enslaved to it (pods' veths a killed run left)."""
    shown = subprocess.run(["ip", "-o", "link", "show", "master", name], capture_output=True, text=True)
    for line in shown.stdout.splitlines():
        subprocess.run(["ip", "link", "del", line.split(":")[1].strip().split("@")[0]], capture_output=True)
    subprocess.run(["ip", "link", "del", name], capture_output=True)


def _undo(entry: dict) -> None:
    kind = entry["kind"]
    if kind == "process":
        if start_time(entry["pid"]) == entry["start"]:
            os.kill(entry["pid"], signal.SIGKILL)
    elif kind == "cgroup":
        kill_cgroup(entry["name"])
    elif kind == "link":
        delete_link(entry["name"])
    elif kind == "sysctl":
        path = pathlib.Path(entry["path"])
        if path.read_text().strip() != entry["old"]:
            path.write_text(entry["old"])
    else:
        raise ValueError(f"unknown host change {kind}")


class Ledger:
    """The host changes of one nodes room, in `<directory>/<owner pid>.json`, written before each change is made."""

    def __init__(self, directory: pathlib.Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{os.getpid()}.json"
        self.entries: list[dict] = []
        self.owner = {"pid": os.getpid(), "start": start_time(os.getpid())}

    def record(self, kind: str, **data) -> dict:
        entry = {"kind": kind, **data}
        self.entries.append(entry)
        self._write()
        return entry

    def done(self, entry: dict) -> None:
        """An entry undone early (a process that was stopped)."""
        self.entries.remove(entry)
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owner": self.owner, "entries": self.entries}, indent=1))
        tmp.replace(self.path)

    def undo(self) -> list[str]:
        """Undoes every entry, newest first; returns the errors (each entry is tried)."""
        errors = undo_entries(self.entries)
        self.entries = []
        self.path.unlink(missing_ok=True)
        return errors


def undo_entries(entries: list[dict]) -> list[str]:
    errors = []
    for entry in reversed(entries):
        try:
            _undo(entry)
        except Exception as e:  # noqa: BLE001 - every change is tried; the failures are reported together
            errors.append(f"{entry}: {e}")
    return errors


def undo_leftovers(directory: pathlib.Path) -> list[str]:
    """Undoes the records of rooms whose owner is gone (a killed run); returns what was undone."""
    undone = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        owner = record.get("owner", {})
        if start_time(owner.get("pid", -1)) == owner.get("start") and owner.get("start") is not None:
            continue  # its room still runs
        errors = undo_entries(record.get("entries", []))
        if errors:
            raise RuntimeError(f"could not undo what a killed run left ({path}): " + "; ".join(errors))
        undone += [f"{e['kind']} {e.get('name') or e.get('pid') or e.get('path')}" for e in record["entries"]]
        path.unlink()
    return undone
