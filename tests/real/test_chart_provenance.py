"""A chart's `verify`/`keyring` under the real CLI, Kubernetes provider (its Helm) and kube-apiserver: a chart signed
with a GPG key (a Helm provenance file, made as `helm package --sign` makes it) installs; the same provenance next to
a chart whose content changed fails `preview` with Helm's checksum error, before anything is installed."""
import hashlib
import io
import subprocess
import tarfile
import uuid

import pulumi
import pytest
from kubernetes import client

from iks_gpu_migration.components.charts import helm_release
from iks_gpu_migration.config import HelmChart

CHART_YAML = "apiVersion: v2\nname: signed-probe\nversion: 0.1.0\n"
CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-made\ndata:\n  v: \"{0}\"\n"


def package(path, value: str) -> None:
    """A chart archive as `helm package` lays it out: <name>/Chart.yaml, <name>/templates/..."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (("Chart.yaml", CHART_YAML), ("templates/configmap.yaml", CONFIGMAP.replace("{0}", value))):
            data = text.encode()
            info = tarfile.TarInfo(f"signed-probe/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def gpg(home, *args: str, stdin: bytes = b"") -> bytes:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase",
                           "", *args], input=stdin, capture_output=True, check=True).stdout


def sign(home, archive) -> None:
    """<archive>.prov: the chart's metadata, `...`, the archive's sha256, clear-signed (helm pkg/provenance/sign.go
    messageBlock, ClearSign)."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    message = f"{CHART_YAML}\n...\nfiles:\n  {archive.name}: sha256:{digest}\n".encode()
    archive.with_name(archive.name + ".prov").write_bytes(
        gpg(home, "--digest-algo", "SHA512", "--clearsign", "-u", "signer@example.com", stdin=message))


@pytest.fixture
def signed_chart(tmp_path):
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    gpg(home, "--quick-gen-key", "chart signer <signer@example.com>", "rsa2048", "sign", "never")
    keyring = tmp_path / "pubring.gpg"
    keyring.write_bytes(gpg(home, "--export", "signer@example.com"))  # binary: what Helm's openpgp.ReadKeyRing reads
    archive = tmp_path / "signed-probe-0.1.0.tgz"
    package(archive, "signed")
    sign(home, archive)
    yield archive, keyring
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False)  # the agent gpg started


def test_a_signed_chart_installs_and_a_changed_one_fails_preview(cluster, project, signed_chart):
    archive, keyring = signed_chart
    ns = f"signed-{uuid.uuid4().hex[:6]}"

    def program():
        import pulumi_kubernetes as k8s
        opts = pulumi.ResourceOptions(provider=k8s.Provider("local", kubeconfig=cluster.kubeconfig.read_text()))
        helm_release(ns, HelmChart(chart=str(archive), version="0.1.0", namespace=ns, verify=True,
                                   keyring=str(keyring)), {}, opts)

    project.write_stack({})
    stack = project.stack("provenance", program)
    good = archive.read_bytes()
    package(archive, "changed after signing")  # same name and version, the .prov of the signed content
    with pytest.raises(Exception) as failed:
        stack.preview(on_output=print)
    assert "sha256 sum does not match for signed-probe-0.1.0.tgz" in str(failed.value)
    core = client.CoreV1Api(cluster.api_client)
    assert not core.list_namespaced_secret(ns, label_selector="owner=helm").items

    archive.write_bytes(good)
    assert stack.up(on_output=print).summary.result == "succeeded"
    assert core.read_namespaced_config_map(f"{ns}-made", ns).data == {"v": "signed"}
    stack.destroy(on_output=print)
    core.delete_namespace(ns)
