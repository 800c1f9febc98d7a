"""The provider host's shared Kubernetes clients (kube/clients.py): one per kubeconfig while the file is unchanged and
the client young; a rewritten kubeconfig (`ibmcloud ks cluster config`) or an old one gets a new client."""
import os
import threading

from iks_gpu_migration.kube import clients

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: "{token}"}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


def write(path, port=6443, token="t1", mtime=None):
    path.write_text(KUBECONFIG.format(port=port, token=token))
    if mtime is not None:
        os.utime(path, ns=(mtime, mtime))
    return str(path)


def test_one_client_per_kubeconfig_shared_by_threads(tmp_path):
    a, b = write(tmp_path / "a"), write(tmp_path / "b", port=7443)
    got = []
    threads = [threading.Thread(target=lambda: got.append(clients.shared_client(a))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in got}) == 1
    assert clients.shared_client(b) is not got[0] and clients.shared_client(b).configuration.host.endswith(":7443")
    assert got[0].configuration.connection_pool_maxsize == clients.POOL_SIZE
    with clients.api_client(a) as api:
        assert api is got[0]
    assert got[0].rest_client.pool_manager is not None  # leaving the block did not close it


def test_watches_have_a_pool_of_their_own(tmp_path):
    """A batch's watches (one per waiting node, each holding its connection) never take the requests' connections."""
    a = write(tmp_path / "a")
    watches = clients.watch_client(a)
    assert watches is clients.watch_client(a)
    assert watches is not clients.shared_client(a)
    assert watches.rest_client.pool_manager is not clients.shared_client(a).rest_client.pool_manager


def test_a_rewritten_kubeconfig_gets_a_new_client_with_its_token(tmp_path):
    path = write(tmp_path / "kubeconfig", token="old", mtime=1_000_000_000_000_000_000)
    old = clients.shared_client(path)
    write(tmp_path / "kubeconfig", token="new", mtime=1_000_000_001_000_000_000)
    new = clients.shared_client(path)
    assert new is not old
    assert new.configuration.api_key["BearerToken"] == "Bearer new"


def test_a_client_older_than_its_ttl_is_rebuilt(tmp_path, monkeypatch):
    path = write(tmp_path / "kubeconfig")
    first = clients.shared_client(path)
    now = clients.time.monotonic()
    monkeypatch.setattr(clients.time, "monotonic", lambda: now + clients.TTL + 1)
    assert clients.shared_client(path) is not first
