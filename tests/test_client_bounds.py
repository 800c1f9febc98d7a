"""Every Kubernetes client of the package is built by kube/clients.py (issue 37 §2, "every request gets a timeout"):
the cluster-identity check, a pool stack's wait for the cluster stack, and the commands `status`, `budget` and
`recover` end against a server that accepts connections and never answers, or answers half a response, instead of
hanging. Each call runs on a thread of its own with a generous guard, so a client without the bound fails the test
instead of blocking it."""
import threading
import time

import pytest
from kubernetes import client

from iks_gpu_migration.cli import budget, status
from iks_gpu_migration.cli.recover.cluster import Cluster
from iks_gpu_migration.iks.identity import ClusterIdentityProvider
from iks_gpu_migration.iks.shared_cluster import SharedClusterReadyProvider
from iks_gpu_migration.kube import clients
from test_request_timeouts import HALF_A_BODY, HEADERS_ONLY, READ, kubeconfig, stalling_server
from test_request_timeouts import fast_timeouts  # noqa: F401 - the fixture
from tests.emulators.iks import IksEmulator

GUARD = 15.0  # seconds: far beyond a bounded call (2 x READ plus connects), far below "for ever"
REPLIES = pytest.mark.parametrize("reply", [b"", HEADERS_ONLY, HALF_A_BODY],
                                  ids=["never-answers", "half-the-headers", "half-a-body"])


def ends(call) -> tuple[float, BaseException | object]:
    """(seconds taken, what `call` raised or returned); fails the test if it is still running after GUARD."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), f"still waiting for an answer after {GUARD} s: the request has no timeout"
    return time.monotonic() - started, outcome[0]


@REPLIES
def test_the_cluster_identity_check_ends(tmp_path, fast_timeouts, reply):  # noqa: F811
    with stalling_server(reply) as (port, _):
        props = {"cluster": "c", "kubeconfig": kubeconfig(tmp_path, port), "api": {}}
        took, error = ends(lambda: ClusterIdentityProvider().create(props))
    assert isinstance(error, Exception) and "timed out" in str(error), error
    assert took < 2 * READ + 2


@REPLIES
def test_a_pool_stacks_wait_for_the_cluster_stack_ends(tmp_path, fast_timeouts, reply):  # noqa: F811
    emu = IksEmulator(master_version="1.37.0_1501").start()
    try:
        with stalling_server(reply) as (port, _):
            props = {"cluster": "gpu-cluster", "version": "1.37", "api": emu.api(), "namespace": "gpu-operator",
                     "kubeconfig": kubeconfig(tmp_path, port), "timeout": 60, "poll_interval": 0.05}
            took, error = ends(lambda: SharedClusterReadyProvider().create(props))
    finally:
        emu.stop()
    assert isinstance(error, Exception) and "timed out" in str(error), error
    assert took < 2 * READ + 5


@REPLIES
def test_budget_ends_with_one_line(tmp_path, fast_timeouts, reply, capsys):  # noqa: F811
    with stalling_server(reply) as (port, _):
        took, code = ends(lambda: budget.main(["--name", "fleet", "--kubeconfig", kubeconfig(tmp_path, port)]))
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: no answer from the API server") and "timed out" in err, err
    assert len(err.splitlines()) == 1 and took < 2 * READ + 2


@REPLIES
def test_status_and_recover_clients_are_bounded(tmp_path, fast_timeouts, reply):  # noqa: F811
    """Their own calls pass a timeout each; the clients bound any call that does not."""
    with stalling_server(reply) as (port, _):
        path = kubeconfig(tmp_path, port)
        for api in (status.connect(path), Cluster(path).api):
            took, error = ends(client.CoreV1Api(api).list_node)
            assert "timed out" in str(error), error
            assert took < 2 * READ + 2


def test_status_retries_a_dead_server_once(tmp_path, fast_timeouts):  # noqa: F811
    """status asks for one retry; the setting reaches the connection pool (it is read when the pool is made)."""
    with stalling_server() as (port, accepted):
        api = status.connect(kubeconfig(tmp_path, port))
        assert api.rest_client.pool_manager.connection_pool_kw["retries"].total == 1
        ends(client.CoreV1Api(api).list_node)
        assert len(accepted) == 2


def test_no_kubernetes_client_is_built_outside_kube_clients():
    """The one place that gives every client its timeouts and credentials: no other module of the package builds one."""
    import pathlib
    import re
    root = pathlib.Path(clients.__file__).resolve().parents[1]
    builders = re.compile(r"new_client_from_config|load_kube_config|ApiClient\(|Configuration\(\)")
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if str(p.relative_to(root)) not in ("kube/clients.py", "kube/credentials.py")
             and builders.search(p.read_text())]
    assert found == []
