"""The shared bounded wait: value on success, progress while waiting, a timeout naming what was awaited."""
import pytest

from iks_gpu_migration.common.waiting import WaitTimeout, optional_float, wait_for


def test_returns_the_value_and_logs_each_new_state():
    states = iter([(False, None, "provisioning"), (False, None, "provisioning"), (False, None, "deploying"),
                   (True, "w2", "deployed")])
    logged = []
    assert wait_for("worker w2", lambda: next(states), timeout=5, interval=0.001, log=logged.append) == "w2"
    assert [line.split(" (")[0] for line in logged] == ["waiting for worker w2: provisioning",
                                                        "waiting for worker w2: deploying"]


def test_unchanged_state_is_logged_again_after_the_heartbeat():
    logged = []
    with pytest.raises(WaitTimeout):
        wait_for("x", lambda: (False, None, "same"), timeout=0.2, interval=0.01, log=logged.append, heartbeat=0.05)
    assert 2 <= len(logged) <= 6


def test_timeout_names_what_was_awaited_and_the_last_state():
    with pytest.raises(WaitTimeout, match=r"timed out after 0s waiting for pod p to finish; last state: phase Pending"):
        wait_for("pod p to finish", lambda: (False, None, "phase Pending"), timeout=0.05, interval=0.01,
                 log=lambda _: None)


def test_poll_errors_propagate():
    def poll():
        raise RuntimeError("HTTP 403 from the API")
    with pytest.raises(RuntimeError, match="403"):
        wait_for("x", poll, timeout=1, interval=0.01, log=lambda _: None)


def test_optional_float():
    assert optional_float(None, 5) == 5.0 == optional_float("", 5)
    assert optional_float("2.5", 5) == 2.5


def test_a_wait_stops_once_the_engine_that_started_the_provider_is_gone(monkeypatch):
    # A SIGKILLed `pulumi` CLI leaves its provider host running, re-parented: it must stop, not act beside the next up.
    from iks_gpu_migration.common import waiting
    polls = []

    def poll():
        polls.append(1)
        if len(polls) == 3:
            monkeypatch.setattr(waiting.os, "getppid", lambda: waiting._ENGINE_PID + 1)
        return False, None, "provisioning"

    with pytest.raises(waiting.Interrupted, match="the engine that started this provider is gone"):
        wait_for("worker w2", poll, timeout=5, interval=0.01, log=lambda _: None)
    assert len(polls) == 3
