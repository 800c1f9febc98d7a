"""A background loop that runs one pass of a double every `interval` seconds, or sooner when `wake` is set (the
cluster cache saw a change), until stopped; a failed pass is logged once and kept in `errors` (a double must keep
running, and tests can read what went wrong)."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

SETTLE = 0.02  # after a wake, the changes that come with it (a new node's DaemonSet pods) are taken in one pass


class PollingLoop:
    def __init__(self, name: str, step: Callable[[], None], interval: float,
                 wake: Optional[threading.Event] = None) -> None:
        self.name, self.step, self.interval, self.wake = name, step, interval, wake
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._log = logging.getLogger(name)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.wake:
            self.wake.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - keep running; errors are kept for the test
                if not self.errors or self.errors[-1] != str(e):
                    self._log.warning("%s: %s", self.name, e)
                    self.errors.append(str(e))
            self._pause()

    def _pause(self) -> None:
        if self.wake is None:
            self._stop.wait(self.interval)
        elif self.wake.wait(self.interval) and not self._stop.wait(SETTLE):
            self.wake.clear()


class Polled:
    """For a double that runs as a PollingLoop: `_poll(name, step)` starts it, `stop()` ends it, `errors` are its."""
    _loop: Optional[PollingLoop] = None
    interval: float

    def _poll(self, name: str, step: Callable[[], None], wake: Optional[threading.Event] = None) -> None:
        self._loop = PollingLoop(name, step, self.interval, wake)
        self._loop.start()

    def stop(self) -> None:
        if self._loop:
            self._loop.stop()

    @property
    def errors(self) -> list[str]:
        return self._loop.errors if self._loop else []
