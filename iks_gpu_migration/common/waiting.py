"""Bounded polling shared by the dynamic providers: progress is logged, and a timeout names what was awaited."""
import contextlib
import os
import threading
import time
from typing import Callable, Optional, TypeVar

import pulumi
import tenacity

T = TypeVar("T")


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


def wait_for(
    what: str,
    poll: Callable[[], tuple[bool, T, str]],
    timeout: float,
    interval: float = 10.0,
    log: Callable[[str], None] = progress,
    heartbeat: float = 60.0,
    sleep: Optional[Callable[[float], None]] = None,
) -> T:
    """Call `poll` until it returns (done=True, value, state); log `state` while waiting.

    `poll` returns (done, value, human-readable state). Exceptions from `poll` propagate. `sleep` waits between
    polls (one that returns early makes the next poll come sooner; the timeout still holds); by default the one
    `waking_with` set for this thread, else interruptible_sleep.
    On timeout raises WaitTimeout naming `what`, the timeout and the last state seen.
    """
    started = time.monotonic()
    last = {"state": "not polled yet", "logged": "", "logged_at": float("-inf")}

    def attempt() -> tuple[bool, T]:
        done, value, state = poll()
        last["state"] = state
        now = time.monotonic()
        # Log each new state, and an unchanged one at most once per `heartbeat`, so long waits stay readable.
        if not done and (state != last["logged"] or now - last["logged_at"] >= heartbeat):
            log(f"waiting for {what}: {state} ({now - started:.0f}s of {timeout:.0f}s)")
            last.update(logged=state, logged_at=now)
        return done, value

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda result: not result[0]),
        wait=tenacity.wait_fixed(interval),
        stop=tenacity.stop_after_delay(timeout),
        sleep=sleep or getattr(_WAKING, "sleep", None) or interruptible_sleep,
        reraise=True,
    )
    try:
        return retrying(attempt)[1]
    except tenacity.RetryError:
        raise WaitTimeout(
            f"timed out after {timeout:.0f}s waiting for {what}; last state: {last['state']}"
        ) from None


def optional_float(value: Optional[object], default: float) -> float:
    """Timeouts arrive from dynamic-provider inputs as numbers or strings; None means default."""
    return default if value in (None, "") else float(value)
