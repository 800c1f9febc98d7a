"""Issue 18 point 5, local demo credentials: the local control plane (gpu_migration_local/control_plane.py, here the
fast tests' session API server) has a random admin token per run, keeps its credentials 0600 in a 0700 directory and
answers a request without a token with 401."""
import json
import ssl
import stat
import urllib.error
import urllib.request

import pytest

from gpu_migration_local.control_plane import ControlPlane


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_credential_files_are_0600_in_a_0700_directory(envtest):
    d = envtest.workdir
    assert mode(d) == 0o700
    for name in ("tokens.csv", "kubeconfig", "sa.key"):
        assert mode(d / name) == 0o600, name


def test_a_request_without_a_token_is_refused_with_401(envtest):
    """Even /version, which RBAC lets anyone read (system:public-info-viewer), needs a token: anonymous auth is off."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    for path in ("/version", "/api/v1/namespaces"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{envtest.control_plane.server}{path}", context=ctx, timeout=10)
        assert refused.value.code == 401, path
    token = envtest.control_plane.admin_token
    request = urllib.request.Request(f"{envtest.control_plane.server}/version",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=ctx, timeout=10) as answer:
        assert answer.status == 200


def test_the_admin_token_is_random_per_run(envtest, tmp_path):
    token = envtest.control_plane.admin_token
    kubeconfig = json.loads(envtest.kubeconfig.read_text())
    assert kubeconfig["users"][0]["user"]["token"] == token
    assert (envtest.workdir / "tokens.csv").read_text().startswith(f"{token},admin,admin,")
    others = {ControlPlane(tmp_path / str(i), tmp_path).admin_token for i in range(3)}
    assert len(others | {token}) == 4 and all(len(t) >= 40 for t in others)
    assert "local-admin-token" not in others | {token}  # the token every run used to share


def test_the_control_planes_ports_are_distinct_and_free():
    """All picked at once: picked one at a time, two components could get the same port (etcd's client and peer
    URLs once did, and etcd stopped with "address already in use")."""
    import socket

    from gpu_migration_local.control_plane import free_ports
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
