"""Bounded polling shared by the dynamic providers: progress is logged, and a timeout names what was awaited.

A wait ends by its deadline whatever a poll does: each poll runs on a thread of its own, awaited at most until the
deadline plus POLL_GRACE; one that is still running then (a request that never got an answer) is left to finish on
its own, its result unused, and the wait raises WaitTimeout. Every Kubernetes request has a timeout of its own
(kube/clients.py; IKS and IAM: iks/api.py), so such a poll ends soon after too.
"""
import contextlib
import contextvars
import os
import threading
import time
from typing import Callable, Optional, TypeVar

import pulumi

T = TypeVar("T")

# How long past its deadline a wait lets a poll that started before it finish: more than one request attempt's
# worst case (kube/clients.py CONNECT_TIMEOUT + READ_TIMEOUT, 10 + 70 s; tests/test_request_timeouts.py keeps them
# in step). A poll near the deadline normally answers within milliseconds: it is abandoned only when stuck.
POLL_GRACE = 90.0


class WaitTimeout(TimeoutError):
    """Raised when `what` did not happen within the timeout; carries the last observed state."""


class Interrupted(KeyboardInterrupt):
    """The process is shutting down (e.g. `pulumi up` was cancelled) while a wait ran."""


# The engine that started this provider process (the dynamic-provider host is the `pulumi` CLI's child). A SIGKILLed
# CLI cannot interrupt its plugins; they are re-parented and would go on waiting and acting beside the next `up`.
_ENGINE_PID = os.getppid()


def engine_gone() -> bool:
    return os.getppid() != _ENGINE_PID


def shutting_down() -> bool:
    """True once the interpreter is shutting down. Dynamic providers run in gRPC worker threads; on cancellation the
    engine sends SIGINT to the provider process (pulumi sdk/go/common/resource/plugin/plugin.go: InterruptChildren,
    SIGKILL 5s later), its main thread leaves (pulumi/dynamic/__main__.py: main) and the interpreter then only waits
    for the workers. Waits notice this here and stop, so cleanup (e.g. deleting a check pod) still runs.
    CPython's threading._shutdown sets _SHUTTING_DOWN before it joins the worker threads (3.9+; the main thread
    only counts as stopped after that), hence the private flag, with the public signal as a fallback."""
    return (bool(getattr(threading, "_SHUTTING_DOWN", False)) or not threading.main_thread().is_alive()
            or engine_gone())


def _slices(seconds: float, slice_: float):
    """The time left of `seconds`, in slices of at most `slice_`, until it is up; raises Interrupted as soon as the
    process shuts down (see shutting_down)."""
    deadline = time.monotonic() + seconds
    while True:
        if shutting_down():
            raise Interrupted("interrupted: the engine that started this provider is gone" if engine_gone()
                              else "interrupted: the provider process is shutting down")
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(slice_, left)


def interruptible_sleep(seconds: float, slice_: float = 0.2) -> None:
    for pause in _slices(seconds, slice_):
        time.sleep(pause)


def sleep_until(changed: Callable[[], bool], condition: threading.Condition, seconds: float,
                slice_: float = 0.2) -> None:
    """interruptible_sleep that ends as soon as `changed()` holds; `changed` is read under `condition`, which whoever
    changes it notifies. For waits on something this process does (another thread's step): no poll interval lost."""
    for pause in _slices(seconds, slice_):
        with condition:
            if changed():
                return
            condition.wait(pause)


def sleep_until_set(event: threading.Event, seconds: float, settle: float = 0.0, slice_: float = 0.2) -> None:
    """interruptible_sleep that ends once `event` is set by another thread (e.g. a watch, kube/node_changes.py): it
    is cleared `settle` seconds later, so the changes that came with it are read by the same next poll."""
    for pause in _slices(seconds, slice_):
        if event.wait(pause):
            time.sleep(settle)
            event.clear()
            return


_WAKING = threading.local()


@contextlib.contextmanager
def waking_with(sleep: Callable[[float], None]):
    """Within the block, this thread's waits (wait_for without its own `sleep`) sleep with `sleep`: e.g. one woken
    by changes to the node they all wait on (kube/node_changes.py), so none needs the sleep passed down to it."""
    previous = getattr(_WAKING, "sleep", None)
    _WAKING.sleep = sleep
    try:
        yield
    finally:
        _WAKING.sleep = previous


def progress(message: str) -> None:
    """A wait's progress: shown as it happens, not again in the CLI's closing Diagnostics (ephemeral: pulumi/pulumi
    pkg/backend/display/progress.go skips ephemeral payloads there), which would otherwise repeat every line (in the
    dynamic-provider host once sdk_workarounds.connect_provider_host_log connected it to the engine)."""
    pulumi.log.info(message, ephemeral=True)


class _Poll:
    """One call of a wait's poll on a thread of its own (a daemon: a stuck one never holds the process up), run in a
    copy of the caller's context (pulumi keeps its settings in contextvars) and with its waking_with sleep (a wait
    inside the poll sleeps as it would have in the caller's thread)."""

    def __init__(self, what: str, poll: Callable[[], tuple[bool, T, str]]) -> None:
        self.done = threading.Event()
        self.outcome: tuple[bool, object] = (False, None)  # (ok, result or exception)
        args = (contextvars.copy_context(), poll, getattr(_WAKING, "sleep", None))
        threading.Thread(target=self._run, args=args, name=f"poll: {what}"[:60], daemon=True).start()

    def _run(self, context: contextvars.Context, poll: Callable, sleep: Optional[Callable[[float], None]]) -> None:
        _WAKING.sleep = sleep
        try:
            self.outcome = (True, context.run(poll))
        except BaseException as e:  # noqa: BLE001 - raised in the waiting thread
            self.outcome = (False, e)
        finally:
            self.done.set()

    def result(self, seconds: float) -> Optional[tuple[bool, T, str]]:
        """The poll's answer, or None if it has none after `seconds`; its exception is raised here. Interrupted as
        soon as the process shuts down (see shutting_down)."""
        for pause in _slices(seconds, 0.2):
            if self.done.wait(pause):
                break
        if not self.done.is_set():
            return None
        ok, value = self.outcome
        if not ok:
            raise value
        return value


def wait_for(
    what: str,
    poll: Callable[[], tuple[bool, T, str]],
    timeout: float,
    interval: float = 10.0,
    log: Callable[[str], None] = progress,
    heartbeat: float = 60.0,
    sleep: Optional[Callable[[float], None]] = None,
    grace: Optional[float] = None,
) -> T:
    """Call `poll` until it returns (done=True, value, state); log `state` while waiting.

    `poll` returns (done, value, human-readable state). Exceptions from `poll` propagate. `sleep` waits between
    polls (one that returns early makes the next poll come sooner; the timeout still holds); by default the one
    `waking_with` set for this thread, else interruptible_sleep.
    On timeout raises WaitTimeout naming `what`, the timeout and the last state seen: at the latest `grace` (default
    POLL_GRACE) seconds after the deadline, when a poll that started before it has not answered by then.
    """
    started = time.monotonic()
    deadline, grace = started + timeout, POLL_GRACE if grace is None else grace
    sleep = sleep or getattr(_WAKING, "sleep", None) or interruptible_sleep
    last = {"state": "not polled yet", "logged": "", "logged_at": float("-inf")}
    while True:
        bound = max(deadline - time.monotonic(), 0.0) + grace
        answer = _Poll(what, poll).result(bound)
        now = time.monotonic()
        if answer is None:
            last["state"] += f" (then a poll had no answer after {bound:.0f}s and was abandoned)"
            break
        done, value, state = answer
        if done:
            return value
        last["state"] = state
        # Log each new state, and an unchanged one at most once per `heartbeat`, so long waits stay readable.
        if state != last["logged"] or now - last["logged_at"] >= heartbeat:
            log(f"waiting for {what}: {state} ({now - started:.0f}s of {timeout:.0f}s)")
            last.update(logged=state, logged_at=now)
        if now >= deadline:
            break
        sleep(min(interval, deadline - now))
    raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last state: {last['state']}")


def optional_float(value: Optional[object], default: float) -> float:
    """Timeouts arrive from dynamic-provider inputs as numbers or strings; None means default."""
    return default if value in (None, "") else float(value)
