"""Credentials that expire mid-run (issue 37 §2): a kubeconfig whose user is an exec credential plugin
(client.authentication.k8s.io/v1, as `ibmcloud ks cluster config` writes) or a tokenFile. Against the session's real
API server: the ServiceAccount's tokens are bound to a Secret (TokenRequest boundObjectRef), so deleting the Secret
makes the API server refuse the old token (401) at once, as it refuses an expired one; the program's waits keep
working with the plugin's next token (kube/credentials.py, kube/clients.py). kube-apiserver keeps a token it
accepted for 10 s (its token success cache), so a token used before it is revoked is refused only after that."""
import datetime
import json
import pathlib
import sys
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from iks_gpu_migration.kube import clients, credentials, fence
from iks_gpu_migration.kube.fence import _ClusterFencedProvider
from iks_gpu_migration.kube.labels import IBM_MANAGED_LABELS
from tests.envtest import eventually

GPU = {"ibm-cloud.kubernetes.io/gpu-enabled": "true"}
EVERYTHING = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
# The plugin: hands out the token in <dir>/token (with <dir>/expiry as expirationTimestamp, if there), counts its runs
# in <dir>/runs; <dir>/fail makes it fail with that text on stderr, <dir>/hang makes it never answer.
PLUGIN = """import json, pathlib, sys, time
d = pathlib.Path(sys.argv[1])
runs = d / "runs"
runs.write_text(str(int(runs.read_text() or 0) + 1) if runs.exists() else "1")
if (d / "hang").exists():
    time.sleep(3600)
if (d / "fail").exists():
    sys.exit((d / "fail").read_text())
status = {"token": (d / "token").read_text()}
if (d / "expiry").exists():
    status["expirationTimestamp"] = (d / "expiry").read_text()
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}))
"""


class Identity:
    """A ServiceAccount allowed everything, whose tokens are each bound to a Secret of their own."""

    def __init__(self, kube, tmp_path: pathlib.Path, base: str):
        self.kube, self.dir = kube, tmp_path / base
        self.dir.mkdir()
        self.ns, self.sa = kube.ns("identities"), base
        self.kubeconfig = pathlib.Path(kube.identity(base, EVERYTHING))  # the SA, its role and a kubeconfig
        self.minted = 0

    def mint(self) -> tuple[str, str]:
        """A new token bound to a new Secret: (token, secret)."""
        self.minted += 1
        secret = f"{self.sa}-token-{self.minted}"
        uid = self.kube.core.create_namespaced_secret(self.ns, {"metadata": {"name": secret}}).metadata.uid
        token = self.kube.core.create_namespaced_service_account_token(self.sa, self.ns, {"spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": secret, "uid": uid}}}).status.token
        return token, secret

    def revoke(self, secret: str) -> None:
        self.kube.core.delete_namespaced_secret(secret, self.ns)

    def use(self, user: dict) -> str:
        cfg = json.loads(self.kubeconfig.read_text())
        cfg["users"][0]["user"] = user
        self.kubeconfig.write_text(json.dumps(cfg))
        return str(self.kubeconfig)

    def exec_kubeconfig(self) -> str:
        (self.dir / "plugin.py").write_text(PLUGIN)
        return self.use({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                                  "args": [str(self.dir / "plugin.py"), str(self.dir)], "interactiveMode": "Never"}})

    def hand_out(self, token: str, expiry: str = "") -> None:
        (self.dir / "token").write_text(token)
        if expiry:
            (self.dir / "expiry").write_text(expiry)

    @property
    def runs(self) -> int:
        return int((self.dir / "runs").read_text()) if (self.dir / "runs").exists() else 0


def refused(kube, token: str) -> bool:
    config = client.Configuration()
    config.host, config.ssl_ca_cert = kube.api.configuration.host, kube.api.configuration.ssl_ca_cert
    config.api_key["BearerToken"] = f"Bearer {token}"
    try:
        client.CoreV1Api(client.ApiClient(config)).list_node(limit=1)
    except ApiException as e:
        return e.status == 401
    return False


def test_a_wait_keeps_working_when_the_plugins_token_is_refused_mid_run(kube, tmp_path, monkeypatch):
    me = Identity(kube, tmp_path, "rotating")
    old, old_secret = me.mint()
    me.hand_out(old)
    kubeconfig = me.exec_kubeconfig()
    node = kube.name("gpu-1")
    kube.add_node(node, labels=GPU, kubelet_version="v1.35.4+IKS")

    def rotate() -> None:  # the plugin hands out a new token; the API server refuses the old one from now on
        new, _ = me.mint()
        me.hand_out(new)
        me.revoke(old_secret)
        eventually(lambda: refused(kube, old), "the revoked token to be refused", timeout=20, interval=0.5)
        assert not refused(kube, new)

    polls = kube.after_calls(monkeypatch, fence, "unfenced", 2, rotate)
    monkeypatch.setattr(fence, "unfenced", _fence_at(fence.unfenced, polls, 5, kube, node))
    props = {"kubeconfig": kubeconfig, "labels": IBM_MANAGED_LABELS, "operator_min_version": "1.36",
             "timeout": 30, "poll_interval": 0.05}
    assert _ClusterFencedProvider().create(props).outs["fenced_everywhere"] is True
    assert len(polls) >= 5
    assert me.runs == 2  # once for the first request, once after the refusal: every later request used its token


def _fence_at(unfenced, polls: list, at: int, kube, node: str):
    """The wait's check; the node gets its fence at the `at`-th poll, polls after the rotation included."""
    def check(*args, **kwargs):
        if len(polls) == at:
            kube.patch_node(node, {"metadata": {"labels": IBM_MANAGED_LABELS}})
        return unfenced(*args, **kwargs)
    return check


def test_a_token_is_obtained_again_before_it_expires_without_a_refusal(kube, tmp_path, monkeypatch):
    me = Identity(kube, tmp_path, "expiring")
    first, _ = me.mint()
    soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)
    me.hand_out(first, soon.strftime("%Y-%m-%dT%H:%M:%SZ"))
    core = client.CoreV1Api(clients.new_client(me.exec_kubeconfig()))
    refusals = []
    monkeypatch.setattr(credentials.Credential, "refused", lambda self, token: refusals.append(token))
    core.list_node(limit=1)
    second, _ = me.mint()
    (me.dir / "expiry").unlink()
    me.hand_out(second)
    time.sleep(1.2)  # past half the token's lifetime: renewed before the next request
    core.list_node(limit=1)
    assert me.runs == 2 and refusals == []
    assert clients.new_client(str(me.kubeconfig)) is not None and me.runs == 2  # a new client shares the credential


def test_a_token_file_that_changes_is_read_again_after_a_refusal(kube, tmp_path):
    me = Identity(kube, tmp_path, "filed")
    old, old_secret = me.mint()
    me.revoke(old_secret)  # before its first use: refused at once
    token_file = tmp_path / "token"
    token_file.write_text(old)
    core = client.CoreV1Api(clients.new_client(me.use({"tokenFile": str(token_file)})))  # reads `old`
    new, _ = me.mint()
    token_file.write_text(new)  # what a projected ServiceAccount token volume does
    core.list_node(limit=1)  # refused, read again, sent again


def test_a_refused_static_token_is_reported_as_it_is(kube, tmp_path):
    me = Identity(kube, tmp_path, "static")
    old, old_secret = me.mint()
    me.revoke(old_secret)
    core = client.CoreV1Api(clients.new_client(me.use({"token": old})))
    with pytest.raises(ApiException) as e:
        core.list_node(limit=1)
    assert e.value.status == 401


@pytest.mark.parametrize("trouble, expected", [
    ("fail", "failed with exit code 1: no IAM session, run `ibmcloud login`"),
    ("hang", "gave no credential within 0.5 s (it was stopped)"),
])
def test_a_plugin_that_fails_or_hangs_says_so(kube, tmp_path, monkeypatch, trouble, expected):
    monkeypatch.setattr(credentials, "EXEC_TIMEOUT", 0.5)
    me = Identity(kube, tmp_path, trouble)
    (me.dir / trouble).write_text("no IAM session, run `ibmcloud login`")
    started = time.monotonic()
    with pytest.raises(credentials.CredentialError) as e:
        clients.new_client(me.exec_kubeconfig())
    assert f"the kubeconfig's exec plugin {sys.executable} {expected}" in str(e.value)
    assert time.monotonic() - started < 5
