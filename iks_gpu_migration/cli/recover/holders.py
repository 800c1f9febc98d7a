"""Who may still hold the stack (pure): the backend's lock files and this project's Pulumi processes, judged so that
`pulumi cancel` never removes the lock of an update that still runs."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from ...config.model import NAMESPACE as PROJECT  # the Pulumi project name

# A lock's timestamp is taken after its process started (pulumi pkg/backend/diy/lock.go newLockContent); a process
# with the lock's pid that started later than this after it is another process that reused the pid.
PID_REUSE_SLACK = 2.0  # seconds: /proc start times count in clock ticks


@dataclass(frozen=True)
class Lock:
    """A DIY backend's lock file: `.pulumi/locks/<stack>/<uuid>.json`, written by the CLI that holds the stack
    (pulumi pkg/backend/diy/lock.go lockContent: pid, username, hostname, timestamp)."""
    path: str
    pid: Optional[int]
    username: str
    hostname: str
    timestamp: Optional[datetime]


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[str, ...]
    cwd: Optional[str]
    started: float  # seconds since the epoch

    def command(self) -> str:
        """The command line with the program's base name, cut at 100 characters."""
        return " ".join([os.path.basename(self.argv[0]), *self.argv[1:]])[:100] if self.argv else "?"


@dataclass(frozen=True)
class Holder:
    lock: Lock
    state: str  # "live" | "dead" | "unknown"
    why: str


def describe(lock: Lock, now: datetime) -> str:
    since = "at an unknown time"
    if lock.timestamp:
        age = int((now - lock.timestamp).total_seconds())
        since = f"since {lock.timestamp.isoformat(timespec='seconds')} ({age // 60} min {age % 60} s ago)"
    return f"{lock.username or '?'}@{lock.hostname or '?'} (pid {lock.pid}) {since}, lock file {lock.path}"


def judge_lock(lock: Lock, this_host: str, proc: Optional[Proc], now: datetime, this_user: str) -> Holder:
    """Live: its pid runs on this host and started before the lock was taken. Dead: the pid is gone, or it now
    belongs to a process started after the lock. Unknown: another host's, unreadable, or another user's pid that is
    not visible: /proc mounted with hidepid hides other users' processes (proc(5)), so "not seen" is not "gone"."""
    who = describe(lock, now)
    if lock.pid is None or lock.timestamp is None:
        return Holder(lock, "unknown", f"unreadable lock file {lock.path}")
    if lock.hostname != this_host:
        return Holder(lock, "unknown", f"held by {who}: another host, so recover can't see whether it still runs")
    if proc is None and lock.username != this_user:
        return Holder(lock, "unknown", f"held by {who}: another user's process, which /proc may hide from "
                                       f"{this_user}, so recover can't see whether it still runs")
    if proc is None:
        return Holder(lock, "dead", f"held by {who}: that process no longer runs")
    if proc.started > lock.timestamp.timestamp() + PID_REUSE_SLACK:
        return Holder(lock, "dead", f"held by {who}: that process no longer runs (pid {lock.pid} is now "
                                    f"`{proc.command()}`, started after the lock was taken)")
    return Holder(lock, "live", f"held by a running update: {who}, `{proc.command()}`")


def is_pulumi(argv: tuple[str, ...]) -> bool:
    """The CLI, a language host, a provider or analyzer plugin, or the Python SDK's dynamic-provider host and program
    runner (`python -m pulumi.dynamic`: sdk/python/cmd/pulumi-resource-pulumi-python; pulumi-language-python-exec)."""
    if not argv:
        return False
    name = os.path.basename(argv[0])
    if name == "pulumi" or name.startswith(("pulumi-language-", "pulumi-resource-", "pulumi-analyzer-")):
        return True
    return "pulumi.dynamic" in argv or any(a.endswith("pulumi-language-python-exec") for a in argv)


def cli_stack(argv: tuple[str, ...]) -> Optional[str]:
    """The stack a `pulumi` CLI process was given (`--stack X`, `--stack=X`, `-s X`), unqualified; None if none."""
    for i, arg in enumerate(argv):
        if arg in ("--stack", "-s") and i + 1 < len(argv):
            return argv[i + 1].rsplit("/", 1)[-1]
        if arg.startswith("--stack="):
            return arg.split("=", 1)[1].rsplit("/", 1)[-1]
    return None


def project_processes(table: dict[int, Proc], project_dir: str, stack: str, self_pid: int) -> list[Proc]:
    """Pulumi processes that may act on `stack` of this project: those working in the project directory (the CLI
    starts its plugins there: pulumi sdk/go/common/resource/plugin/plugin.go newPlugin, `cmd.Dir = pwd`), except a
    CLI given another stack and the plugins under it. A plugin left by a killed CLI is re-parented and counts."""
    def other_stack(p: Proc) -> bool:
        seen: set[int] = set()
        while p is not None and p.pid not in seen:
            seen.add(p.pid)
            if p.argv and os.path.basename(p.argv[0]) == "pulumi" and cli_stack(p.argv) not in (None, stack):
                return True
            p = table.get(p.ppid)
        return False

    return sorted((p for p in table.values()
                   if p.pid != self_pid and p.cwd == project_dir and is_pulumi(p.argv) and not other_stack(p)),
                  key=lambda p: p.pid)


@dataclass(frozen=True)
class CancelDecision:
    cancel: bool
    why: str
    blockers: tuple[str, ...] = ()  # recover stops, whatever --force says
    needs_force: str = ""  # recover stops unless --force


def decide_cancel(backend: str, holders: list[Holder], procs: list[Proc], in_progress: Optional[str],
                  stack: str, pending: bool) -> CancelDecision:
    """Whether `pulumi cancel` (which on a DIY backend deletes every lock file of the stack, and on Pulumi Cloud
    ends whatever update runs: pkg/backend/diy/backend.go CancelCurrentUpdate) may run: only with a sign of an update
    that did not finish (pending operations, a lock file, an update Cloud reports in progress; a kill between two
    steps leaves a lock and no pending operation) and none of one that runs. `in_progress`: for Pulumi Cloud, when
    the update it reports as running started ("" if it reports none, None if unknown)."""
    blockers = []
    if procs:
        pids = " ".join(str(p.pid) for p in procs)
        blockers.append("Pulumi processes of this project still run: "
                        + "; ".join(f"pid {p.pid} `{p.command()}`" for p in procs)
                        + f". If they are left from the killed update, end them (`kill {pids}`) and run recover "
                        f"again; if an update runs, let it finish")
    live = [h for h in holders if h.state == "live"]
    blockers += [f"the stack is {h.why}: let it finish (or end it, `kill {h.lock.pid}`, if it hangs), then run "
                 f"recover again" for h in live]
    if live:
        return CancelDecision(False, "no `pulumi cancel`: an update that runs holds the stack", tuple(blockers))
    if backend == "file":
        if not holders:
            return CancelDecision(False, "no `pulumi cancel`: the stack has no lock", tuple(blockers))
        unknown = [h.why for h in holders if h.state == "unknown"]
        force = "; ".join(unknown) + ": check that no update of this stack runs there" if unknown else ""
        return CancelDecision(True, "`pulumi cancel` removes the stack's lock, "
                              + "; ".join(h.why for h in holders), tuple(blockers), force)
    if backend == "cloud":
        if in_progress == "":
            return CancelDecision(False, "no `pulumi cancel`: Pulumi Cloud reports no update in progress",
                                  tuple(blockers))
        since = f" since {in_progress}" if in_progress else ""
        return CancelDecision(True, f"`pulumi cancel` ends the update Pulumi Cloud reports in progress{since}",
                              tuple(blockers),
                              f"on Pulumi Cloud `pulumi cancel` ends whatever update runs on the stack, from any "
                              f"machine, and recover can't see which process holds it: check with `pulumi stack "
                              f"--stack {stack}` (when it started, who requested it) that it is the killed one")
    if not pending:
        return CancelDecision(False, "no `pulumi cancel`: no pending operations, and this backend's lock files are "
                              "not read here", tuple(blockers))
    return CancelDecision(True, "`pulumi cancel` removes every lock of the stack", tuple(blockers),
                          f"this backend keeps its lock files in a bucket recover does not read, and `pulumi cancel` "
                          f"deletes them all, a running update's too: {check_bucket_locks(stack)}")


def check_bucket_locks(stack: str) -> str:
    """What to look at before cancelling on a bucket backend, whose lock files recover does not read."""
    return (f"check that the files under .pulumi/locks/organization/{PROJECT}/{stack}/ name no running process "
            f"(pid, hostname, timestamp)")
