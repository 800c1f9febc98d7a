"""The container runtime for the pods whose real program can run here: today the NVIDIA GPU Operator's controller.

kwok plays every pod's status, but runs nothing. For a pod whose image is one tools/build produced from its Go module
(IMAGES), this runs the container's real command as the kubelet and containerd would: the image's filesystem as root
(tools/build lays it out as the image's Dockerfile does), the pod's hostPath volumes and service account token mounted
where the container expects them, its env resolved (values and fieldRefs), the in-cluster API address in
KUBERNETES_SERVICE_HOST/PORT (client-go rest.InClusterConfig), and its output as the container's log. A pod deleted
or gone stops the process (SIGTERM, then SIGKILL after the grace period); a process that exits is restarted with
the kubelet's back-off (10 s doubling to 5 min, pkg/kubelet/kuberuntime: CrashLoopBackOff) and the pod is
marked not ready meanwhile.

Isolation is a mount namespace and chroot (util-linux `unshare`; as a normal user inside a user namespace, as the
rootless container runtimes do), so nothing outside the process sees its mounts. What is not reproduced is the pod's
network namespace: a container's ports would open on this machine, so the image's listening ports are turned off
with its own flags (Image.no_listen).
"""
from __future__ import annotations

import logging
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from kubernetes import client

from .cluster_cache import ClusterCache
from .kubelet_logs import LogStore
from .polling import Polled

log = logging.getLogger("gpu-migration-local")

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3600  # the kubelet's projected token: 1 h, renewed at 80% of its life (pkg/kubelet/token)
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0


@dataclass(frozen=True)
class Image:
    """An image that can run here: `root` is its filesystem; `no_listen` the flags that keep it off host ports."""
    repository: str
    root: pathlib.Path
    no_listen: tuple[str, ...] = ()


def image_repository(image: str) -> str:
    """nvcr.io/nvidia/gpu-operator:v25.10.1 (or @sha256:...) -> nvcr.io/nvidia/gpu-operator."""
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def os_release(node: client.V1Node) -> str:
    """/etc/os-release of a node, from the OS its kubelet reports (status.nodeInfo.osImage, which the kubelet reads
    from PRETTY_NAME of that file: pkg/kubelet/nodestatus/setters.go, cadvisor GetOSImage). IKS workers run Ubuntu."""
    pretty = (node.status.node_info.os_image if node.status and node.status.node_info else "") or "Ubuntu 24.04"
    parts = pretty.split()
    os_id = parts[0].lower()
    version = next((p for p in parts[1:] if p[:1].isdigit()), "")
    version_id = ".".join(version.split(".")[:2])
    return (f'PRETTY_NAME="{pretty}"\nNAME="{parts[0]}"\nVERSION_ID="{version_id}"\nVERSION="{version}"\n'
            f"ID={os_id}\n")


def field_ref(pod: client.V1Pod, path: str) -> str:
    """The downward API fields a container env may name (pkg/api/v1/pod util: ConvertDownwardAPIFieldLabel)."""
    values = {
        "metadata.name": pod.metadata.name, "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid, "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name or "default",
        "status.hostIP": pod.status.host_ip if pod.status else "", "status.podIP": pod.status.pod_ip if pod.status else "",
    }
    if path not in values:
        raise ValueError(f"pod {pod.metadata.namespace}/{pod.metadata.name}: env fieldRef {path!r} is not supported "
                         f"by the local container runtime")
    return values[path] or ""


def container_env(pod: client.V1Pod, container: client.V1Container, api_port: int) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/",
           "HOSTNAME": pod.metadata.name, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(api_port)}
    for e in container.env or []:
        if e.value_from is None:
            env[e.name] = e.value or ""
        elif e.value_from.field_ref is not None:
            env[e.name] = field_ref(pod, e.value_from.field_ref.field_path)
        else:
            raise ValueError(f"pod {pod.metadata.namespace}/{pod.metadata.name}: env {e.name} from a Secret, "
                             f"ConfigMap or resource field is not supported by the local container runtime")
    return env


@dataclass
class Running:
    """One container's process and what it needs kept fresh."""
    pod: client.V1Pod
    container: str
    popen: subprocess.Popen
    dir: pathlib.Path
    token_at: float
    started: float
    restarts: int = 0
    backoff: float = BACKOFF_START
    reader: Optional[threading.Thread] = None


@dataclass
class ContainerRuntime(Polled):
    api_client: client.ApiClient
    logs: LogStore
    images: dict[str, Image]
    workdir: pathlib.Path
    api_port: int
    ca_file: pathlib.Path
    cache: ClusterCache
    interval: float = 0.5  # also the clock of the restart back-off; pods are taken up on each change the cache sees
    backoff_start: float = BACKOFF_START  # the kubelet's; a test may shorten it
    _running: dict[tuple[str, str], Running] = field(default_factory=dict)
    _waiting: dict[tuple[str, str], float] = field(default_factory=dict)  # back-off: restart not before
    _restarts: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)  # (restarts, last back-off)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)

    def start(self) -> "ContainerRuntime":
        """Call check_isolation() first (LocalCluster does, before the control plane starts)."""
        self._poll("container-runtime", self.sync, self.cache.subscribe())
        return self

    def stop(self) -> None:
        super().stop()
        for key in list(self._running):
            self._stop(key)

    def sync(self) -> None:
        wanted = {}
        for pod in self.cache.pods():
            if pod.status is None or pod.status.phase != "Running" or pod.metadata.deletion_timestamp is not None \
                    or not pod.spec.node_name:
                continue
            for c in pod.spec.containers:
                if image_repository(c.image) in self.images:
                    wanted[(pod.metadata.uid, c.name)] = (pod, c)
        for key in [k for k in self._running if k not in wanted]:
            self._stop(key)
        for key in [k for k in self._waiting if k not in wanted]:  # gone while in back-off
            self._waiting.pop(key)
            self._restarts.pop(key, None)
        for key, (pod, c) in wanted.items():
            self._keep_running(key, pod, c)

    def _keep_running(self, key, pod: client.V1Pod, c: client.V1Container) -> None:
        run = self._running.get(key)
        if run is not None and run.popen.poll() is None:
            if pod.spec.service_account_name and time.time() - run.token_at > 0.8 * TOKEN_SECONDS:
                self._write_token(pod, run.dir / "serviceaccount")
                run.token_at = time.time()
            return
        if run is not None:
            self._exited(key, run, pod, c)
        if time.monotonic() >= self._waiting.get(key, 0):
            self._running[key] = self._launch(pod, c)

    def _exited(self, key, run: Running, pod: client.V1Pod, c: client.V1Container) -> None:
        """The kubelet's back-off: 10 s, doubled per restart up to 5 min, reset once a container ran 10 min."""
        del self._running[key]
        ran = time.monotonic() - run.started
        backoff = self.backoff_start if ran > 600 or not run.restarts else min(run.backoff * 2, BACKOFF_MAX)
        log.warning("container %s of pod %s/%s exited with %s after %.0f s; restarting in %.0f s",
                    c.name, pod.metadata.namespace, pod.metadata.name, run.popen.returncode, ran, backoff)
        self._restarts[key] = (run.restarts + 1, backoff)
        self._waiting[key] = time.monotonic() + backoff
        self._mark(pod, c, ready=False, exit_code=run.popen.returncode, restarts=run.restarts + 1)

    def _launch(self, pod: client.V1Pod, c: client.V1Container) -> Running:
        key = (pod.metadata.uid, c.name)
        restarts, backoff = self._restarts.get(key, (0, self.backoff_start))
        image = self.images[image_repository(c.image)]
        d = self.workdir / "containers" / f"{pod.metadata.uid}-{c.name}"
        mounts = self._volumes(pod, c, d)
        env = container_env(pod, c, self.api_port)
        argv = [*(c.command or []), *(c.args or []), *image.no_listen]
        out = open(d / "output.log", "ab")
        popen = subprocess.Popen(isolated(image.root, mounts, argv), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        run = Running(pod, c.name, popen, d, time.time(), time.monotonic(), restarts, backoff)
        run.reader = threading.Thread(target=self._pump, args=(run, out), daemon=True,
                                      name=f"log-{pod.metadata.name}-{c.name}")
        run.reader.start()
        if restarts:
            self._mark(pod, c, ready=True, restarts=restarts)
        log.info("started container %s of pod %s/%s on node %s: %s", c.name, pod.metadata.namespace,
                 pod.metadata.name, pod.spec.node_name, shlex.join(argv))
        return run

    def _pump(self, run: Running, out) -> None:
        with out:
            for raw in run.popen.stdout:
                out.write(raw)
                out.flush()
                self.logs.append(run.pod.metadata.namespace, run.pod.metadata.name, run.container,
                                 raw.decode(errors="replace").rstrip("\n"), run.pod.metadata.uid)

    def _volumes(self, pod: client.V1Pod, c: client.V1Container, d: pathlib.Path) -> list[tuple[str, str, bool]]:
        """(source here, path in the container, read-only) for the service account token and hostPath mounts."""
        d.mkdir(parents=True, exist_ok=True)
        (d / "tmp").mkdir(exist_ok=True)
        mounts = [(str(d / "tmp"), "/tmp", False)]
        # The ServiceAccount admission plugin (off here, as in envtest) names the SA and adds its token volume; the
        # charts name theirs. A pod without one gets no token, as it would without that plugin.
        if pod.spec.service_account_name:
            sa = d / "serviceaccount"
            sa.mkdir(exist_ok=True)
            self._write_token(pod, sa)
            shutil.copyfile(self.ca_file, sa / "ca.crt")
            (sa / "namespace").write_text(pod.metadata.namespace)
            mounts.insert(0, (str(sa), SA_DIR, True))
        volumes = {v.name: v for v in pod.spec.volumes or []}
        node = self.core.read_node(pod.spec.node_name)
        for m in c.volume_mounts or []:
            v = volumes.get(m.name)
            if v is None or v.host_path is None:
                raise ValueError(f"pod {pod.metadata.namespace}/{pod.metadata.name}: volume {m.name} is not a "
                                 f"hostPath; the local container runtime mounts hostPath volumes only")
            mounts.append((str(host_path(node, v.host_path.path, d)), m.mount_path, bool(m.read_only)))
        return mounts

    def _write_token(self, pod: client.V1Pod, sa: pathlib.Path) -> None:
        """A token bound to the pod, as the kubelet's projected service account volume holds (TokenRequest with
        boundObjectRef: it stops working once the pod is deleted)."""
        req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=TOKEN_SECONDS,
            bound_object_ref=client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod.metadata.name,
                                                           uid=pod.metadata.uid)))
        token = self.core.create_namespaced_service_account_token(
            pod.spec.service_account_name, pod.metadata.namespace, req).status.token
        tmp = sa / "token.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.replace(tmp, sa / "token")

    def _mark(self, pod: client.V1Pod, c: client.V1Container, ready: bool, restarts: int,
              exit_code: Optional[int] = None) -> None:
        """The container's status as the kubelet reports it: not ready in back-off, ready again once restarted."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        state = {"running": {"startedAt": now}} if ready else \
            {"waiting": {"reason": "CrashLoopBackOff", "message": f"exited with {exit_code}"}}
        status = "True" if ready else "False"
        try:
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
                "conditions": [{"type": "Ready", "status": status}, {"type": "ContainersReady", "status": status}],
                "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": ready,
                                       "restartCount": restarts, "started": ready, "state": state}]}})
        except client.ApiException as e:
            if e.status != 404:
                raise

    def _stop(self, key) -> None:
        run = self._running.pop(key)
        self._waiting.pop(key, None)
        self._restarts.pop(key, None)
        grace = (run.pod.spec.termination_grace_period_seconds or 30) if run.pod.spec else 30
        if run.popen.poll() is None:
            os.killpg(run.popen.pid, signal.SIGTERM)
            try:
                run.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(run.popen.pid, signal.SIGKILL)
                run.popen.wait(timeout=10)
        if run.reader:
            run.reader.join(timeout=5)
        log.info("stopped container %s of pod %s/%s", run.container, run.pod.metadata.namespace, run.pod.metadata.name)
        shutil.rmtree(run.dir, ignore_errors=True)


def host_path(node: client.V1Node, path: str, d: pathlib.Path) -> pathlib.Path:
    """A hostPath of a node without a filesystem: files the node would have are written from what it reports; other
    paths are empty directories of their own."""
    local = d / "host" / path.strip("/").replace("/", "_")
    if path == "/etc/os-release":
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(os_release(node))
    else:
        local.mkdir(parents=True, exist_ok=True)
    return local


def isolated(root: pathlib.Path, mounts: list[tuple[str, str, bool]], argv: list[str]) -> list[str]:
    """The command that runs `argv` chrooted in `root` with `mounts` bound, in a mount namespace of its own (a user
    namespace too unless root). Mount points are created in the image root first, as a runtime's rootfs setup does."""
    script = ["set -e"]
    for source, target, read_only in mounts:
        inside = root / target.lstrip("/")
        if pathlib.Path(source).is_dir():
            inside.mkdir(parents=True, exist_ok=True)
        else:
            inside.parent.mkdir(parents=True, exist_ok=True)
            inside.touch(exist_ok=True)
        script.append(f"mount --bind {shlex.quote(source)} {shlex.quote(str(inside))}")
        if read_only:
            script.append(f"mount -o remount,bind,ro {shlex.quote(str(inside))}")
    script.append(f'exec chroot {shlex.quote(str(root))} "$@"')
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", "--mount", "--propagation", "private", *user, "--", "sh", "-c", "\n".join(script), "sh", *argv]


def check_isolation() -> None:
    """Fails at once, with what to do, where a mount namespace can't be made (e.g. unprivileged user namespaces
    turned off, as Ubuntu 24.04's AppArmor default does for programs without a profile)."""
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        raise RuntimeError("the local environment runs the GPU Operator chrooted in a mount namespace and needs "
                           "`unshare` (util-linux) and `chroot` (coreutils) on PATH")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    probe = subprocess.run(["unshare", "--mount", *user, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(
            f"`unshare --mount {' '.join(user)}` failed ({probe.stderr.strip() or probe.returncode}): the local "
            "environment runs the real GPU Operator in a mount namespace of its own. Allow unprivileged user "
            "namespaces (e.g. `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0` on Ubuntu 24.04, or "
            "`kernel.unprivileged_userns_clone=1` on Debian) or run as root")
