"""No wait without an end (issue 37): every Kubernetes, IKS and IAM request has a timeout, a wait ends at its deadline
whatever its poll does, a shared read is awaited for a bounded time, and Helm releases wait a configurable time.

The servers here are real TCP servers on 127.0.0.1 (port picked by the OS) that accept connections and then answer
nothing, or half a response: what a load balancer that dropped its state or a stalled VPN looks like to a client."""
import contextlib
import copy
import socket
import threading
import time

import pytest
from kubernetes import client

from harness import registered_by, stack_config
from iks_gpu_migration.common import coalesced, waiting
from iks_gpu_migration.common.coalesced import Coalesced, SharedReadTimeout
from iks_gpu_migration.common.waiting import WaitTimeout, wait_for
from iks_gpu_migration.components import charts
from iks_gpu_migration.config import ConfigError, HelmChart, parse
from iks_gpu_migration.config.model import Timeouts
from iks_gpu_migration.iks import api as iks_api
from iks_gpu_migration.kube import clients, node_changes

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{scheme}://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
HEADERS_ONLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"  # the blank line never comes
HALF_A_BODY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"kind\": \"NodeLi"
A_WATCH_THAT_STALLS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
READ = 0.4  # the tests' read timeout


@contextlib.contextmanager
def stalling_server(reply: bytes = b""):
    """Yields (port, accepted): a server that accepts every connection, sends `reply` once and then nothing."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop, accepted = threading.Event(), []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the accept timeout: look at `stop` again
                continue
            accepted.append(conn)
            if reply:
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


@pytest.fixture
def fast_timeouts(monkeypatch):
    monkeypatch.setattr(clients, "CONNECT_TIMEOUT", READ)
    monkeypatch.setattr(clients, "READ_TIMEOUT", READ)
    monkeypatch.setattr(clients, "_CLIENTS", clients._Clients())  # clients of this test only


def kubeconfig(tmp_path, port: int, scheme: str = "http") -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(scheme=scheme, port=port))
    return str(path)


def timed(call, expected: type = Exception) -> tuple[float, BaseException]:
    started = time.monotonic()
    with pytest.raises(expected) as raised:
        call()
    return time.monotonic() - started, raised.value


@pytest.mark.parametrize("reply", [b"", HEADERS_ONLY], ids=["never-answers", "half-the-headers"])
def test_a_request_to_a_server_that_never_answers_fails_within_two_read_timeouts(tmp_path, fast_timeouts, reply):
    with stalling_server(reply) as (port, accepted):
        core = client.CoreV1Api(clients.shared_client(kubeconfig(tmp_path, port)))
        took, error = timed(core.list_node)
        # One read timeout, retried once on a new connection (clients.RETRIES), then a clear error.
        assert 2 * READ - 0.05 <= took < 2 * READ + 2, took
        assert len(accepted) == 2
    assert "Read timed out" in str(error) and f"port={port}" in str(error)


def test_half_a_body_fails_within_one_read_timeout(tmp_path, fast_timeouts):
    with stalling_server(HALF_A_BODY) as (port, _):
        core = client.CoreV1Api(clients.shared_client(kubeconfig(tmp_path, port)))
        took, error = timed(core.list_node)
    assert READ - 0.05 <= took < READ + 2, took
    assert "Read timed out" in str(error)


def test_a_tls_handshake_that_never_completes_fails_within_the_connect_timeouts(tmp_path, fast_timeouts):
    with stalling_server() as (port, _):
        core = client.CoreV1Api(clients.shared_client(kubeconfig(tmp_path, port, "https")))
        took, error = timed(lambda: core.read_node("n1"))
    assert took < 4 * READ + 2, took  # at most 4 attempts (clients.RETRIES), each bounded
    assert "timed out" in str(error)


def test_a_call_of_its_own_timeout_keeps_it(tmp_path, fast_timeouts):
    with stalling_server() as (port, accepted):
        core = client.CoreV1Api(clients.shared_client(kubeconfig(tmp_path, port)))
        took, _ = timed(lambda: core.list_node(_request_timeout=(READ, 2 * READ)))
    assert 4 * READ - 0.05 <= took < 4 * READ + 2, took


def test_a_watch_whose_connection_stalls_ends_after_its_server_side_timeout(tmp_path, fast_timeouts, monkeypatch):
    monkeypatch.setattr(node_changes, "WATCH_SECONDS", 1)  # the API's timeoutSeconds is an integer
    monkeypatch.setattr(node_changes, "WATCH_READ_MARGIN", -0.5)  # reads time out after 0.5 s
    with stalling_server(A_WATCH_THAT_STALLS) as (port, _):
        watch = node_changes._Watch(kubeconfig(tmp_path, port), "nodes")
        took, error = timed(lambda: watch._watch("1"))  # from a resourceVersion: no list first
    assert 0.45 <= took < 0.5 + 2, (took, error)
    assert "Read timed out" in str(error)


def test_a_wait_whose_request_hangs_fails_with_the_request_error(tmp_path, fast_timeouts):
    with stalling_server() as (port, _):
        core = client.CoreV1Api(clients.shared_client(kubeconfig(tmp_path, port)))
        took, error = timed(lambda: wait_for("node n1 to be Ready", lambda: (True, core.read_node("n1"), "read"),
                                             timeout=30, interval=0.01, log=lambda _: None))
    assert took < 2 * READ + 2 and "Read timed out" in str(error)


def test_a_wait_ends_at_its_deadline_even_when_its_poll_never_returns():
    released, polls = threading.Event(), []

    def poll():
        polls.append(time.monotonic())
        if len(polls) == 1:
            return False, None, "phase Pending"
        released.wait(30)  # a call that never returns (until the test lets it go)
        return True, "late", "done"

    try:
        took, error = timed(lambda: wait_for("pod p to finish", poll, timeout=0.5, interval=0.05,
                                             log=lambda _: None, grace=0.2))
    finally:
        released.set()
    assert isinstance(error, WaitTimeout)
    assert 0.5 <= took < 0.7 + 1, took  # the deadline plus the grace, not the poll's 30 s
    assert str(error).startswith("timed out after 0s waiting for pod p to finish; last state: phase Pending (then a "
                                 "poll had no answer after ")


def test_a_poll_that_answers_within_the_grace_after_the_deadline_still_counts():
    def poll():
        time.sleep(0.3)
        return True, "ready", "ready"

    assert wait_for("x", poll, timeout=0.1, interval=0.05, log=lambda _: None, grace=2) == "ready"


def test_a_wait_stops_waiting_on_a_stuck_poll_when_the_engine_is_gone(monkeypatch):
    released = threading.Event()
    monkeypatch.setattr(waiting.os, "getppid", lambda: waiting._ENGINE_PID + 1)
    try:
        took, error = timed(lambda: wait_for("x", lambda: released.wait(30), timeout=30, log=lambda _: None),
                            waiting.Interrupted)
    finally:
        released.set()
    assert isinstance(error, waiting.Interrupted) and took < 2


def test_a_reader_waits_for_a_stuck_shared_read_a_bounded_time():
    shared, started, released = Coalesced(), threading.Event(), threading.Event()

    def stuck():
        started.set()
        released.wait(30)
        return "late"

    leader = threading.Thread(target=lambda: shared.call(("node-views", 1234, "gpu-operator"), stuck), daemon=True)
    leader.start()
    try:
        assert started.wait(5)
        took, error = timed(lambda: shared.call(("node-views", 1234, "gpu-operator"), lambda: "mine", wait=0.3))
    finally:
        released.set()
        leader.join(5)
    assert isinstance(error, SharedReadTimeout) and 0.3 <= took < 2, took
    assert "waiting for the shared read of node-views gpu-operator" in str(error)
    assert not leader.is_alive()


def test_the_bounds_stay_in_step():
    attempt = clients.CONNECT_TIMEOUT + clients.READ_TIMEOUT
    assert waiting.POLL_GRACE > attempt  # a poll's request ends before the wait gives up on it
    assert coalesced.READ_WAIT >= 2 * attempt  # a read of a few requests, each with a retry
    assert clients.READ_TIMEOUT > 60  # kube-apiserver's --request-timeout default
    assert clients.RETRIES.read == 1


def test_iks_and_iam_requests_have_a_timeout(monkeypatch):
    monkeypatch.setattr(iks_api, "HTTP_TIMEOUT", (READ, READ))
    monkeypatch.setattr(iks_api, "IAM_ATTEMPTS", 1)
    with stalling_server() as (port, _):
        endpoint = f"http://127.0.0.1:{port}"
        iks = iks_api.IksClient(endpoint, endpoint, "key-for-a-test-of-timeouts", max_retries=0, retry_interval=0)
        assert iks.http_config["timeout"] == (READ, READ) == iks.authenticator.token_manager.http_config["timeout"]
        took, error = timed(lambda: iks.get_cluster("c"))
    assert took < READ + 2 and isinstance(error, iks_api.IksApiError)
    assert "IBM Cloud IAM at" in str(error) and "ReadTimeout" in str(error)


def test_helm_releases_wait_timeouts_helm():
    chart = HelmChart(chart="gpu-operator", repo="https://helm.ngc.nvidia.com/nvidia", version="v25.10.1",
                      namespace="gpu-operator")
    (release,) = registered_by(lambda: charts.gpu_operator_release(chart))
    assert release.inputs["atomic"] is True and release.inputs["timeout"] == 7200 == Timeouts().helm
    (release,) = registered_by(lambda: charts.gpu_operator_release(chart, timeout=900.5))
    assert release.inputs["timeout"] == 901  # whole seconds, never less than asked


def test_the_stacks_timeouts_helm_reaches_both_releases():
    from harness import run_program
    raw = copy.deepcopy(stack_config("pilot"))
    raw["timeouts"] = {**raw.get("timeouts", {}), "helm": 10800}
    run = run_program(raw)
    releases = run.of_type("kubernetes:helm.sh/v3:Release")
    assert {r.name for r in releases} == {"gpu-operator", "dra-driver"}
    assert all(r.inputs["timeout"] == 10800 for r in releases), [(r.name, r.inputs["timeout"]) for r in releases]


@pytest.mark.parametrize("value, expected", [(0, "greater than 0"), (10 ** 7, "is more than 7 days"),
                                             ("inf", "finite number")])
def test_timeouts_helm_is_checked_like_every_timeout(value, expected):
    raw = copy.deepcopy(stack_config("pilot"))
    assert parse(raw).timeouts.helm == 7200
    raw["timeouts"] = {"helm": value}
    with pytest.raises(ConfigError) as e:
        parse(raw)
    assert "gpu-migration:timeouts.helm: " in str(e.value) and expected in str(e.value)


def test_a_wait_inside_a_poll_sleeps_with_the_callers_waking_sleep():
    slept = []

    def inner_poll():
        return len(slept) > 0, "inner", "not yet"

    def poll():
        return True, wait_for("inner", inner_poll, timeout=5, interval=0.01, log=lambda _: None), "done"

    with waiting.waking_with(slept.append):
        assert wait_for("outer", poll, timeout=5, interval=0.01, log=lambda _: None) == "inner"
    assert slept == [0.01]
