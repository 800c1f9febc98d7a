"""One real node: a kubelet and its own containerd in a mount namespace of their own, under a cgroup root of their
own, with its own CNI bridge, registered with the local control plane.

Why a mount namespace per node: the device-plugin registration socket is always
/var/lib/kubelet/device-plugins/kubelet.sock whatever --root-dir says (k8s.io/kubelet deviceplugin/v1beta1
constants.go KubeletSocket), and the kubelet empties that directory when it starts; two kubelets on one host would
take each other's. So each node gets, as a kind node container has (kind pkg/cluster/internal/providers/docker/
provision.go): its own /run, /var/lib and /var/log (tmpfs, gone with the namespace), with its on-disk directories
bind-mounted at /var/lib/kubelet and /var/lib/containerd. A `sleep` holds the namespace (`unshare -m --propagation
private`); containerd, the kubelet and any device plugin join it with `nsenter -t <holder> -m`.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..control_plane import Process
from . import config, host

MOUNTS = """set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /var/lib
mount -t tmpfs -o mode=0755 tmpfs /var/log
mkdir -p /var/lib/kubelet /var/lib/containerd
mount --bind "$1/kubelet" /var/lib/kubelet
mount --bind "$1/containerd" /var/lib/containerd
echo ready
exec sleep infinity
"""


def free_port_on(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], Optional[str]], timeout: float, state: Callable[[], str],
             alive: Callable[[], None] = lambda: None) -> None:
    """Polls `check` (None when done, else the state it saw) until `timeout`; the error names what was awaited, the
    last state seen and `state()` (log tails)."""
    deadline, last = time.monotonic() + timeout, "nothing seen yet"
    while time.monotonic() < deadline:
        alive()
        seen = check()
        if seen is None:
            return
        last = seen
        time.sleep(0.2)
    raise TimeoutError(f"{what} not after {timeout:.0f} s (last seen: {last})\n{state()}")


@dataclass
class RealNode:
    name: str
    dir: pathlib.Path
    tools: pathlib.Path  # tools/build's bin directory
    ledger: host.Ledger
    net: config.NodeNet
    cgroup: str  # the node's cgroupRoot, without the leading /
    holder: Optional[subprocess.Popen] = None
    processes: dict[str, Process] = field(default_factory=dict)
    _entries: dict[str, dict] = field(default_factory=dict)
    _kubelet_env: Optional[dict] = None

    def _preexec(self) -> None:
        host.join_cgroup(self.cgroup)

    def _record_process(self, key: str, pid: int) -> None:
        self._entries[key] = self.ledger.record("process", pid=pid, start=host.start_time(pid))

    def start_namespace(self) -> None:
        """The node's cgroup, bridge and mount namespace, each recorded before it is made."""
        for d in ("kubelet", "containerd", "cni", "cdi", "logs", "volume-plugins"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self.ledger.record("cgroup", name=self.cgroup)
        host.make_cgroup(self.cgroup)
        self.ledger.record("link", name=self.net.bridge)
        for cmd in (["ip", "link", "add", self.net.bridge, "type", "bridge"],
                    ["ip", "addr", "add", f"{self.net.ip}/24", "dev", self.net.bridge],
                    ["ip", "link", "set", self.net.bridge, "up"]):
            subprocess.run(cmd, check=True, capture_output=True)
        self.holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", MOUNTS, "mounts",
                                        str(self.dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, preexec_fn=self._preexec, start_new_session=True)
        self._record_process("holder", self.holder.pid)
        line = self.holder.stdout.readline().decode().strip() if self.holder.stdout else ""
        if line != "ready":
            err = self.holder.stderr.read().decode() if self.holder.stderr else ""
            raise RuntimeError(f"node {self.name}: its mount namespace failed (unshare -m): {line} {err}".strip())

    def run_in_namespace(self, key: str, argv: list[str], env: Optional[dict] = None) -> Process:
        """Starts `argv` in the node's mount namespace and cgroup, its output in <dir>/logs/<key>.log."""
        assert self.holder is not None
        p = Process(f"{self.name}/{key}", ["nsenter", "-t", str(self.holder.pid), "-m", "--", *argv],
                    self.dir / "logs" / f"{key}.log")
        with open(p.log, "ab") as out:
            p.popen = subprocess.Popen(p.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, preexec_fn=self._preexec, start_new_session=True)
        self.processes[key] = p
        self._record_process(key, p.popen.pid)
        return p

    def stop_process(self, key: str) -> None:
        p = self.processes.pop(key, None)
        if p is not None:
            p.stop()
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.ledger.done(entry)

    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        assert self.holder is not None
        done = subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", "--", str(self.tools / "ctr"),
                               "--address", config.CONTAINERD_SOCK, "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"node {self.name}: ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def start_containerd(self, timeout: float) -> None:
        cfg = self.dir / "containerd.toml"
        cni_conf = self.dir / "cni"
        (cni_conf / "10-pods.conflist").write_text(config.cni_conflist(self.net))
        cfg.write_text(config.containerd_toml(self.tools, cni_conf, self.dir / "cdi"))
        # The shim is found on PATH (containerd's runtime v2 manager looks up containerd-shim-runc-v2 there).
        env = {**os.environ, "PATH": f"{self.tools}:{os.environ.get('PATH', '')}"}
        proc = self.run_in_namespace("containerd", [str(self.tools / "containerd"), "--config", str(cfg)], env=env)

        def answers() -> Optional[str]:
            try:
                self.ctr("version", timeout=5)
                return None
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                return str(e)[-200:]
        wait_for(f"node {self.name}: containerd answering on {config.CONTAINERD_SOCK}", answers, timeout,
                 proc.tail, proc.check_alive)

    def import_image(self, archive: pathlib.Path) -> None:
        self.ctr("images", "import", str(archive))

    def restart_kubelet(self) -> Process:
        """Stops the kubelet (SIGTERM, as a node's service manager restarts it) and starts it again, same flags;
        containerd and the pods keep running, as on a node."""
        old = self.processes["kubelet"]
        self.stop_process("kubelet")
        return self.run_in_namespace("kubelet", old.argv[old.argv.index("--") + 1:], env=self._kubelet_env)

    def start_kubelet(self, kubeconfig: pathlib.Path, kubelet_cfg: pathlib.Path) -> Process:
        # The kubelet adds KUBE-IPTABLES-HINT, KUBE-FIREWALL and canary chains to the host's tables when it finds
        # iptables (pkg/kubelet/kubelet_network_linux.go), and the node shares the host's network namespace. Its
        # PATH leaves out the sbin directories where Debian and Ubuntu keep iptables, so it finds none and says so.
        path = f"{self.tools}:/usr/local/bin:/usr/bin:/bin"
        if found := shutil.which("iptables", path=path):
            raise RuntimeError(f"node {self.name}: iptables is on the kubelet's PATH ({found}): the kubelet would "
                               "add KUBE-* chains to the host's tables, which a stop does not undo; real nodes need "
                               "iptables only under /usr/sbin or /sbin, or not installed")
        self._kubelet_env = {**os.environ, "PATH": path}
        return self.run_in_namespace("kubelet", [
            str(self.tools / "kubelet"), "--config", str(kubelet_cfg), "--kubeconfig", str(kubeconfig),
            "--node-ip", self.net.ip, "--hostname-override", self.name, "--cert-dir", str(self.dir / "kubelet-pki"),
            "--v", "2"], env=self._kubelet_env)

    def stop(self) -> None:
        """Stops the kubelet (SIGTERM), the other processes started here, then the namespace's holder; what is left
        in the node's cgroup (shims, containers) and the cgroup and bridge themselves go with ledger.undo."""
        self.stop_process("kubelet")
        for key in list(self.processes):
            self.stop_process(key)
        if self.holder is not None and self.holder.poll() is None:
            # Reaped here, so no zombie of ours lingers in the node's cgroup while the ledger empties it.
            self.holder.kill()
            self.holder.wait(10)
            self.ledger.done(self._entries.pop("holder"))
