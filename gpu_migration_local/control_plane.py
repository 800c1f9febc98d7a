"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok.

Like controller-runtime's envtest (pkg/internal/testing/controlplane): real binaries, loopback only, a throw-away data
dir, an admin token in system:masters. Nodes have no kubelet: kwok plays node and pod status, and the doubles in
gpu_doubles.py play the NVIDIA components. DRA allocation is done by the real kube-scheduler.

Credentials are those of a real cluster, small: a random admin token per run (`secrets.token_urlsafe`), the data dir
0700 and every credential file in it (token file, kubeconfig, service account key) 0600, and no anonymous requests
(`--anonymous-auth=false`: a request without a token is answered 401).
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Optional

from .pki import ClusterCA

KWOK_STAGES = pathlib.Path(__file__).with_name("kwok-stages.yaml")

# kube-controller-manager controllers the migration needs (names as in cmd/kube-controller-manager/names):
# ResourceClaim cleanup needs the resourceclaim controller and GC for the claim's ownerRef to its pod (KEP-5004);
# DaemonSets of the stand-in charts need the daemonset controller; Deployments need deployment + replicaset.
CONTROLLERS = [
    "resourceclaim-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "job-controller",
    "pod-garbage-collector-controller",
    "disruption-controller",  # PodDisruptionBudget status, which the Eviction API reads
    # Removes the node.kubernetes.io/not-ready taint that admission (TaintNodesByCondition) puts on every new Node
    # once kwok reports it Ready, and sets it again when a node's lease lapses — as on a real cluster.
    "node-lifecycle-controller",
]


@dataclass(frozen=True)
class NodeHealth:
    """How nodes prove they are alive, and how soon the node-lifecycle controller gives up on them.

    Defaults are a real cluster's: the kubelet holds a Lease in kube-node-lease of 40 s and renews it every quarter
    of that (kubelet config `nodeLeaseDurationSeconds`, pkg/kubelet/apis/config/v1beta1/defaults.go; kwok renews the
    same way, pkg/kwok/controllers/controller.go `initNodeLeaseController`), and the node-lifecycle controller marks
    a node Unknown — and its pods not ready — 50 s after the last renewal (`--node-monitor-grace-period`,
    pkg/controller/nodelifecycle/config/v1alpha1/defaults.go), checking every 5 s (`--node-monitor-period`).
    A test may run the same clock faster."""
    lease_seconds: int = 40
    grace: str = "50s"
    monitor_period: str = "5s"


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports on 127.0.0.1. Each socket stays bound until all are picked: one at a time, the
    kernel may hand the port it just freed out again (etcd once got the same port for its client and peer URLs and
    stopped with "bind: address already in use")."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class Process:
    name: str
    argv: list[str]
    log: pathlib.Path
    popen: Optional[subprocess.Popen] = None

    def start(self, env: Optional[dict] = None) -> None:
        with open(self.log, "ab") as out:
            # A new session: stopping the control plane never signals the test runner's process group.
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True, stdin=subprocess.DEVNULL)

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; last log lines:\n{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


@dataclass
class ControlPlane:
    """Start with `start()`, stop with `stop()`; `kubeconfig` is an admin kubeconfig for 127.0.0.1."""
    workdir: pathlib.Path
    bin_dir: pathlib.Path
    kubelet_port: int = 0  # where nodes' kubelet endpoint points (the kubelet log double); 0: none
    # What runs beside etcd and kube-apiserver; () is an envtest-style API server alone (tests/envtest.py).
    components: tuple[str, ...] = ("kube-scheduler", "kube-controller-manager", "kwok")
    node_health: NodeHealth = NodeHealth()
    processes: list[Process] = field(default_factory=list)
    apiserver_port: int = 0
    # A fresh admin token for every control plane: a token fixed in the source would open any run's API server.
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # Opt-in: an audit Policy (audit.k8s.io/v1, as a dict); the API server then writes its events to `audit_log`
    # (JSON lines; k8s.io/apiserver pkg/apis/audit/v1 types.go). Tests read it for the answers to a given user.
    audit_policy: Optional[dict] = None
    # Opt-in: real kubelets join (gpu_migration_local/nodes): see _real_node_flags. Off, the API server is the one
    # kwok's nodes always had.
    real_nodes: bool = False
    ca: Optional[ClusterCA] = None

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.workdir / "kubeconfig"

    @property
    def ca_file(self) -> pathlib.Path:
        """The API server's self-signed serving certificate, which clients trust as its CA."""
        return self.workdir / "apiserver-certs" / "apiserver.crt"

    @property
    def audit_log(self) -> pathlib.Path:
        return self.workdir / "audit.log"

    def _audit_flags(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", **self.audit_policy}))
        return ["--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_log)]

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _proc(self, name: str, argv: list[str]) -> Process:
        p = Process(name, argv, self.workdir / f"{name}.log")
        self.processes.append(p)
        return p

    def start(self, timeout: float = 120.0) -> "ControlPlane":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o700)  # it holds the credentials below
        d = self.workdir
        _openssl("genrsa", "-out", str(d / "sa.key"), "2048")
        (d / "sa.key").chmod(0o600)
        write_private(d / "tokens.csv", f'{self.admin_token},admin,admin,"system:masters"\n')
        etcd_port, peer_port, self.apiserver_port, scheduler_port, kcm_port = free_ports(5)
        self._write_kubeconfig()

        etcd = self._proc("etcd", [
            self._bin("etcd"), "--data-dir", str(d / "etcd"), "--name", "default",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # a throw-away store: durability buys nothing here
        ])
        etcd.start()
        apiserver = self._proc("kube-apiserver", self._apiserver_argv(etcd_port))
        apiserver.start()
        self._wait_ready(f"{self.server}/readyz", "kube-apiserver /readyz", timeout, [etcd, apiserver])
        # Clients verify the API server: its self-signed serving cert (with its CA) from --cert-dir.
        self._write_kubeconfig(ca=self.ca_file)
        if not self.components:
            return self

        common = ["--kubeconfig", str(self.kubeconfig), "--authentication-kubeconfig", str(self.kubeconfig),
                  "--authorization-kubeconfig", str(self.kubeconfig), "--leader-elect=false",
                  "--bind-address", "127.0.0.1"]
        scheduler = self._proc("kube-scheduler", [self._bin("kube-scheduler"), *common,
                                                  "--secure-port", str(scheduler_port)])
        kcm = self._proc("kube-controller-manager", [
            self._bin("kube-controller-manager"), *common, "--secure-port", str(kcm_port),
            *self._real_node_controllers(), "--use-service-account-credentials=false",
            "--concurrent-gc-syncs", "5",
            # The controllers' client limit (default 20 requests/s, burst 30) let a batch of 10 new nodes' DaemonSet
            # pods (6 operands each) trickle out over 2-3 s, slower than anything the program does; on a real cluster
            # those pods take minutes to pull and start whatever the limit. Measured with benchmarks/real_fleet.py.
            "--kube-api-qps", "200", "--kube-api-burst", "400",
            "--node-monitor-grace-period", self.node_health.grace,
            "--node-monitor-period", self.node_health.monitor_period,
        ])
        kwok = self._proc("kwok", [
            self._bin("kwok"), "--kubeconfig", str(self.kubeconfig), "--config", str(self._kwok_stages()),
            # Only nodes the local IKS cluster creates (annotation kwok.x-k8s.io/node=fake) are played by kwok.
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
            # Every node's kubelet endpoint is the kubelet log double on 127.0.0.1 (the API server proxies
            # pods/log there, as it does to a real kubelet); its port is written into the node stage.
            "--node-ip", "127.0.0.1",
            "--cidr", "10.1.0.1/16",
            # Node Leases, renewed as a kubelet renews them: without them the node-lifecycle controller marks every
            # node Unknown one grace period after it registers, and its pods not ready (then the GPU doubles
            # withdraw the GPUs of a not-ready device-plugin or kubelet-plugin pod, as the kubelet would).
            "--node-lease-duration-seconds", str(self.node_health.lease_seconds),
        ])
        for p in (scheduler, kcm, kwok):
            if p.name in self.components:
                p.start()
        if scheduler.name in self.components:
            self._wait_ready(f"https://127.0.0.1:{scheduler_port}/healthz", "kube-scheduler /healthz", timeout,
                             [scheduler])
        if kcm.name in self.components:
            self._wait_ready(f"https://127.0.0.1:{kcm_port}/healthz", "kube-controller-manager /healthz", timeout,
                             [kcm])
            self.wait_for_default_service_account(timeout)
        return self

    def _apiserver_argv(self, etcd_port: int) -> list[str]:
        d = self.workdir
        sa = str(d / "sa.key")
        return [
            self._bin("kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.apiserver_port), "--cert-dir", str(d / "apiserver-certs"),
            "--token-auth-file", str(d / "tokens.csv"),
            "--anonymous-auth=false",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", sa, "--service-account-signing-key-file", sa,
            # Only an allocator range for Service IPs; nothing is routed to it.
            "--service-cluster-ip-range", "10.0.0.0/24",
            "--allow-privileged=true",
            *self._real_node_flags(),
            "--kubelet-preferred-address-types", "InternalIP",
            "--enable-priority-and-fairness=false",
            # 1.37 refuses a loopback advertise address for the kubernetes Service endpoints; nothing routes there.
            "--endpoint-reconciler-type", "none", *self._audit_flags(),
        ]

    def _real_node_flags(self) -> list[str]:
        """Without real nodes: RBAC alone, and (as envtest) no ServiceAccount admission, as there is no kubelet to
        mount tokens. With them, what kubeadm gives a cluster's API server for its kubelets: client certificates of
        the cluster CA, the Node authorizer before RBAC and NodeRestriction admission for node identities
        (plugin/pkg/auth/authorizer/node, plugin/pkg/admission/noderestriction), ServiceAccount admission, and a
        client certificate of its own for the kubelets' API (logs, exec; cmd/kubeadm/app/phases/controlplane)."""
        if not self.real_nodes:
            return ["--authorization-mode", "RBAC", "--disable-admission-plugins", "ServiceAccount"]
        self.ca = ClusterCA(self.workdir / "pki").create()
        cert, key = self.ca.apiserver_kubelet_client()
        return ["--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
                "--client-ca-file", str(self.ca.cert),
                "--kubelet-client-certificate", str(cert), "--kubelet-client-key", str(key)]

    def _real_node_controllers(self) -> list[str]:
        """With real nodes, kube-root-ca.crt in every namespace for the projected token volumes the kubelet mounts
        (pkg/controller/certificates/rootcacertpublisher), the CA being the API server's serving certificate."""
        if not self.real_nodes:
            return ["--controllers", ",".join(CONTROLLERS)]
        return ["--controllers", ",".join([*CONTROLLERS, "root-ca-certificate-publisher-controller"]),
                "--root-ca-file", str(self.ca_file)]

    def _kwok_stages(self) -> pathlib.Path:
        path = self.workdir / "kwok-stages.yaml"
        path.write_text(KWOK_STAGES.read_text().replace("${KUBELET_PORT}", str(self.kubelet_port)))
        return path

    def _write_kubeconfig(self, ca: Optional[pathlib.Path] = None) -> None:
        cluster = {"server": self.server}
        if ca is None:
            cluster["insecure-skip-tls-verify"] = True  # only to wait for /readyz before the cert exists
        else:
            cluster["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": "admin", "user": {"token": self.admin_token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        }
        write_private(self.kubeconfig, json.dumps(cfg, indent=1))

    def _wait_ready(self, url: str, what: str, timeout: float, procs: list[Process]) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        deadline, last = time.monotonic() + timeout, "no answer yet"
        while time.monotonic() < deadline:
            for p in procs:
                p.check_alive()
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.admin_token}"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except Exception as e:  # noqa: BLE001 - any failure is "not ready yet"; the last one is reported
                last = str(e)
            time.sleep(0.3)
        logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
        raise TimeoutError(f"{what} not ready after {timeout:.0f} s (last: {last})\n{logs}")

    def wait_for_default_service_account(self, timeout: float) -> None:
        """The serviceaccount controller creates `default` in each namespace; Helm and pods expect it."""
        from kubernetes import client, config as kconfig
        api = client.CoreV1Api(kconfig.new_client_from_config(str(self.kubeconfig)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                api.read_namespaced_service_account("default", "default")
                return
            except client.ApiException:
                time.sleep(0.3)
        raise TimeoutError(f"no default ServiceAccount after {timeout:.0f} s (serviceaccount controller)")

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.stop()


def write_private(path: pathlib.Path, text: str) -> None:
    """Write a credential file readable by its owner only (0600), also when it existed with wider modes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def self_signed_cert(directory: pathlib.Path, name: str) -> tuple[str, str]:
    """A throw-away serving certificate for 127.0.0.1 (the kubelet log double)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert))
    return str(cert), str(key)


def temp_workdir(prefix: str = "gpu-migration-cluster-") -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix=prefix))


def remove_workdir(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

