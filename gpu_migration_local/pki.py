"""A cluster CA and the certificates real kubelets need, made with openssl as kubeadm's certs phase lays them out
(cmd/kubeadm/app/phases/certs/certlist.go): the CA the API server trusts for client certificates (`--client-ca-file`)
and the kubelets trust for the API server's calls to them (`authentication.x509.clientCAFile`); a client certificate
per node, CN `system:node:<name>` in O `system:nodes` (what the Node authorizer and NodeRestriction identify,
plugin/pkg/auth/authorizer/node); the API server's kubelet client certificate (`--kubelet-client-certificate`), in
`system:masters` as kubeadm's `apiserver-kubelet-client` was; and each kubelet's serving certificate for its node IP.
Keys are 0600 in a 0700 directory.
"""
from __future__ import annotations

import pathlib
import subprocess


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class ClusterCA:
    def __init__(self, directory: pathlib.Path):
        self.dir = directory
        self.cert, self.key = directory / "ca.crt", directory / "ca.key"

    def create(self) -> "ClusterCA":
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7", "-subj", "/CN=gpu-migration-local-ca",
                 "-keyout", str(self.key), "-out", str(self.cert))
        self.key.chmod(0o600)
        return self

    def issue(self, name: str, subject: str, *, client: bool, ip: str = "") -> tuple[pathlib.Path, pathlib.Path]:
        """A certificate signed by this CA: for client authentication, or serving `ip`."""
        cert, key, csr, ext = (self.dir / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key),
                 "-out", str(csr))
        key.chmod(0o600)
        usage = "clientAuth" if client else "serverAuth"
        ext.write_text(f"extendedKeyUsage={usage}\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                       + (f"subjectAltName=IP:{ip}\n" if ip else ""))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key), "-CAcreateserial",
                 "-days", "7", "-extfile", str(ext), "-out", str(cert))
        csr.unlink()
        ext.unlink()
        return cert, key

    def node_client(self, node: str) -> tuple[pathlib.Path, pathlib.Path]:
        return self.issue(f"node-{node}", f"/O=system:nodes/CN=system:node:{node}", client=True)

    def apiserver_kubelet_client(self) -> tuple[pathlib.Path, pathlib.Path]:
        return self.issue("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client",
                          client=True)

    def kubelet_serving(self, node: str, ip: str) -> tuple[pathlib.Path, pathlib.Path]:
        return self.issue(f"kubelet-{node}", f"/CN={node}", client=False, ip=ip)
