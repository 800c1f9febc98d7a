"""The local container runtime's pure parts: which image runs, what the container sees (env, /etc/os-release, mounts),
and NFD's labels of a node."""
import pytest
from kubernetes import client

from gpu_migration_local.container_runtime import container_env, image_repository, isolated, os_release
from gpu_migration_local.gpu_doubles import nfd_labels


def node(os_image="Ubuntu 24.04.3 LTS", kernel="6.8.0-88-generic") -> client.V1Node:
    info = client.V1NodeSystemInfo(
        architecture="amd64", boot_id="", container_runtime_version="containerd://1.7.27", kernel_version=kernel,
        kube_proxy_version="v1.36.2", kubelet_version="v1.36.2", machine_id="", operating_system="linux",
        os_image=os_image, system_uuid="")
    return client.V1Node(metadata=client.V1ObjectMeta(name="10.240.0.22"), status=client.V1NodeStatus(node_info=info))


@pytest.mark.parametrize("image,repo", [
    ("nvcr.io/nvidia/gpu-operator:v25.10.1", "nvcr.io/nvidia/gpu-operator"),
    ("nvcr.io/nvidia/gpu-operator@sha256:" + "a" * 64, "nvcr.io/nvidia/gpu-operator"),
    ("nvcr.io/nvidia/gpu-operator:v25.10.1@sha256:" + "a" * 64, "nvcr.io/nvidia/gpu-operator"),
    ("localhost:5000/gpu-operator", "localhost:5000/gpu-operator"),
    ("localhost:5000/gpu-operator:v1", "localhost:5000/gpu-operator"),
    ("nvcr.io/nvidia/gpu-operator-validator:v25.10.1", "nvcr.io/nvidia/gpu-operator-validator"),
])
def test_image_repository(image, repo):
    assert image_repository(image) == repo


def test_os_release_as_the_node_reports_its_os():
    text = os_release(node())
    assert 'PRETTY_NAME="Ubuntu 24.04.3 LTS"' in text.splitlines()
    assert "ID=ubuntu" in text.splitlines()
    assert 'VERSION_ID="24.04"' in text.splitlines()


def test_container_env_resolves_values_and_field_refs():
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="gpu-operator-abc", namespace="gpu-operator", uid="u1"),
                       spec=client.V1PodSpec(node_name="10.240.0.22", containers=[]))
    c = client.V1Container(name="gpu-operator", env=[
        client.V1EnvVar(name="WATCH_NAMESPACE", value=""),
        client.V1EnvVar(name="OPERATOR_NAMESPACE", value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path="metadata.namespace"))),
        client.V1EnvVar(name="DRIVER_MANAGER_IMAGE", value="nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1")])
    env = container_env(pod, c, 6443)
    assert env["OPERATOR_NAMESPACE"] == "gpu-operator" and env["WATCH_NAMESPACE"] == ""
    assert env["DRIVER_MANAGER_IMAGE"].endswith("k8s-driver-manager:v0.8.1")
    # client-go's in-cluster config (rest.InClusterConfig) reads these two.
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    bad = client.V1Container(name="x", env=[client.V1EnvVar(name="S", value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name="s", key="k")))])
    with pytest.raises(ValueError, match="env S from a Secret"):
        container_env(pod, bad, 6443)


def test_isolated_binds_each_mount_then_chroots(tmp_path):
    """The command's shape; that it runs is shown by the real operator in tests/real (it reads /host-etc/os-release
    and its assets in /opt/gpu-operator only through these mounts and this root)."""
    root = tmp_path / "root"
    (tmp_path / "os-release").write_text("ID=ubuntu\n")
    argv = isolated(root, [(str(tmp_path / "os-release"), "/host-etc/os-release", True), (str(tmp_path), "/tmp", False)],
                    ["/usr/bin/gpu-operator", "--leader-elect"])
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert argv[-3:] == ["sh", "/usr/bin/gpu-operator", "--leader-elect"]
    script = argv[argv.index("-c") + 1].splitlines()
    assert script[1] == f"mount --bind {tmp_path / 'os-release'} {root / 'host-etc/os-release'}"
    assert script[2] == f"mount -o remount,bind,ro {root / 'host-etc/os-release'}"
    assert script[3] == f"mount --bind {tmp_path} {root / 'tmp'}"
    assert script[-1] == f'exec chroot {root} "$@"'
    # Mount points are made in the image root, a file for a file and a directory for a directory.
    assert (root / "host-etc" / "os-release").is_file() and (root / "tmp").is_dir()


def test_nfd_labels_of_a_gpu_node():
    labels = nfd_labels(node(), has_gpus=True)
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["feature.node.kubernetes.io/system-os_release.ID"] == "ubuntu"
    assert labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"] == "24.04"
    assert labels["feature.node.kubernetes.io/system-os_release.VERSION_ID.major"] == "24"
    assert labels["feature.node.kubernetes.io/kernel-version.full"] == "6.8.0-88-generic"
    assert (labels["feature.node.kubernetes.io/kernel-version.major"],
            labels["feature.node.kubernetes.io/kernel-version.minor"]) == ("6", "8")
    assert "feature.node.kubernetes.io/pci-10de.present" not in nfd_labels(node(), has_gpus=False)


def test_a_host_without_user_namespaces_is_told_what_to_change(monkeypatch):
    import subprocess

    from gpu_migration_local import container_runtime as rt
    monkeypatch.setattr(rt.os, "geteuid", lambda: 1000)
    refused = subprocess.CompletedProcess([], 1, "", "unshare: write failed /proc/self/uid_map: Operation not permitted")
    monkeypatch.setattr(rt.subprocess, "run", lambda argv, **kw: refused)
    with pytest.raises(RuntimeError) as e:
        rt.check_isolation()
    assert "`unshare --mount --user --map-root-user` failed (unshare: write failed /proc/self/uid_map" in str(e.value)
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in str(e.value) and "or run as root" in str(e.value)
