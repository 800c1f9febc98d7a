"""One local environment per project: `start` holds an exclusive lock on <project>/.local/session.lock for as long as
its process lives, with its pid in the file.

A lock, not the pid in .local/session.json alone: the kernel drops it however the process ends (kill -9 too), so a
stale file never blocks the next `start`; a recycled pid or a zombie (the session's parent not yet waited for it) never
looks like a running session; and two `start`s at the same moment can't both win.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import time
from typing import IO, Optional

CLAIM_ATTEMPTS = 5  # a probe (holder) holds a shared lock for microseconds: retry before calling the lock taken


class Taken(RuntimeError):
    """Another process of this project holds the lock; `pid` is its pid (0 while it writes it)."""

    def __init__(self, pid: int):
        super().__init__(f"held by pid {pid}")
        self.pid = pid


def claim(lock: pathlib.Path) -> IO[str]:
    """The exclusive lock for this process, or Taken. Keep the returned file open: closing it releases the lock."""
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    f = open(lock, "a+")  # never truncated before the lock is ours: the holder's pid stays readable
    for attempt in range(CLAIM_ATTEMPTS):
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt + 1 == CLAIM_ATTEMPTS:
                f.close()
                raise Taken(holder(lock) or 0) from None
            time.sleep(0.05)
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def holder(lock: pathlib.Path) -> Optional[int]:
    """The pid of the process that holds the lock (0 while it has not written it yet), or None if nobody does."""
    try:
        f = open(lock)
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = f.read().strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


def held(lock: pathlib.Path) -> bool:
    return holder(lock) is not None
