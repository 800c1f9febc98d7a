"""The local container runtime against the real API server: a pod's real program runs chrooted in its image's
filesystem with the pod's mounts, its output is the container's log (through the API server's pods/log), it stops
with the pod, and a program that exits is restarted with the kubelet's back-off while the pod is not ready."""
import shutil
import uuid

from kubernetes import client

from gpu_migration_local import tools
from gpu_migration_local.container_runtime import ContainerRuntime, Image

from .kube import eventually, kwok_node

IMAGE = "local.test/kwok"


def test_a_pods_program_runs_restarts_with_back_off_and_stops_with_the_pod(cluster, tmp_path):
    core = client.CoreV1Api(cluster.api_client)
    # An image with one static program: kwok's binary, whose --version prints and exits.
    root = tmp_path / "image"
    (root / "usr" / "bin").mkdir(parents=True)
    shutil.copy(tools.bin_dir() / "kwok", root / "usr" / "bin" / "kwok")
    runtime = ContainerRuntime(cluster.api_client, cluster.logs, {IMAGE: Image(IMAGE, root)}, tmp_path / "work",
                               cluster.control_plane.apiserver_port, cluster.control_plane.ca_file, cluster.cache,
                               interval=0.2, backoff_start=1.0).start()
    node, ns = f"10.79.0.{uuid.uuid4().int % 200 + 10}", f"runtime-{uuid.uuid4().hex[:6]}"
    core.create_node(kwok_node(node, {}))
    core.create_namespace({"metadata": {"name": ns}})
    eventually(lambda: core.read_namespaced_service_account("default", ns), "the namespace's default ServiceAccount")
    try:
        core.create_namespaced_pod(ns, {"metadata": {"name": "prints"}, "spec": {
            "nodeName": node, "serviceAccountName": "default", "containers": [{"name": "c", "image": f"{IMAGE}:v1",
                                              "command": ["/usr/bin/kwok", "--version"],
                                              "volumeMounts": [{"name": "os", "mountPath": "/host-etc/os-release",
                                                                "readOnly": True}]}],
            "volumes": [{"name": "os", "hostPath": {"path": "/etc/os-release"}}]}})
        eventually(lambda: "kwok" in core.read_namespaced_pod_log("prints", ns, container="c"),
                   "the program's output as the container's log")
        # It ran with the pod's token, CA and namespace where client-go's in-cluster config reads them.
        sa = next((tmp_path / "work" / "containers").iterdir()) / "serviceaccount"
        assert {f.name for f in sa.iterdir()} >= {"token", "ca.crt", "namespace"}
        restarted = eventually(
            lambda: (s := core.read_namespaced_pod("prints", ns).status.container_statuses[0]).restart_count >= 2 and s,
            "two restarts with back-off", timeout=30)
        assert restarted.restart_count >= 2
        core.delete_namespaced_pod("prints", ns, grace_period_seconds=0)
        eventually(lambda: not runtime._running and not runtime._waiting, "the runtime forgets the deleted pod")
    finally:
        runtime.stop()
        core.delete_namespace(ns)
        core.delete_node(node)
    assert runtime.errors == []
