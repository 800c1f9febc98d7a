"""`pulumi up` of a minimal local stack of this program under the real CLI, engine and Kubernetes provider."""
import uuid

import pulumi
from kubernetes import client

from iks_gpu_migration.components import dra_path as dra
from iks_gpu_migration.kube.inventory import IKS_WORKER_ID_LABEL
from tests.emulators.iks import IksEmulator

from .kube import GPU_PRESENT, eventually, kwok_node
from .project import local_config, meaningful, planned_changes


def test_minimal_stack_up_under_the_real_cli(cluster, project):
    core = client.CoreV1Api(cluster.api_client)
    iks = IksEmulator(cluster="local-min", master_version="1.37.0_1501").start()
    try:
        worker = iks.add_worker(version="1.35.4_1540")
        node = f"10.9.0.{uuid.uuid4().int % 200 + 10}"
        # As IKS labels it: the cluster identity check ties the node to the emulator's cluster by its worker ID.
        core.create_node(kwok_node(node, {GPU_PRESENT: "true", IKS_WORKER_ID_LABEL: worker["id"]},
                                   {"gpu-migration.local/ibm-managed-driver": "true"}, kubelet_version="v1.35.4"))
        project.write_stack(local_config(cluster, iks, [{"name": node, "workerId": worker["id"],
                                                          "stage": "ibm-managed"}]))
        stack = project.stack()
        result = stack.up(on_output=print)
        assert result.summary.result == "succeeded"
        # A dynamic provider (MasterVersion) and Kubernetes resources (NodePatch, Helm release) ran for real.
        labels = core.read_node(node).metadata.labels
        assert labels["nvidia.com/gpu.deploy.operands"] == "false"
        # The operator (its double) deletes every GPU state label once operands=false (removeAllGPUStateLabels),
        # deploy.driver included; what matters is that no operand is scheduled there.
        assert labels.get("nvidia.com/gpu.deploy.driver") != "true"
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        assert [p.metadata.name for p in pods if p.metadata.name.startswith("nvidia-")] == []
        assert client.AppsV1Api(cluster.api_client).read_namespaced_deployment("gpu-operator", "gpu-operator")
        assert result.outputs[f"node:{node}"].value["stage"] == "ibm-managed"
        types = {r["type"] for r in stack.export_stack().deployment["resources"]}
        assert {"kubernetes:core/v1:NodePatch", "kubernetes:helm.sh/v3:Release"} <= types
        assert any(t.startswith("pulumi-python:dynamic:") or "MasterVersion" in t for t in types), types
        # Nothing but the every-up checks changes on the next preview: no perpetual diff.
        assert meaningful(planned_changes(stack)) == {}
        stack.destroy(on_output=print)
    finally:
        iks.stop()


def test_kubernetes_provider_creates_device_class_with_extended_resource_name(cluster, project):
    """The provider built from the served module handles resource.k8s.io/v1 DeviceClass.spec.extendedResourceName."""
    name = f"example-{uuid.uuid4().hex[:6]}.com/gpu"

    def program():
        import pulumi_kubernetes as k8s
        provider = k8s.Provider("local", kubeconfig=cluster.kubeconfig.read_text())
        dc = dra.device_class(name, "gpu.nvidia.com", [], opts=pulumi.ResourceOptions(provider=provider))
        pulumi.export("name", dc.metadata.name)

    project.write_stack({})
    stack = project.stack("dc", program)
    out = stack.up(on_output=print).outputs
    got = client.CustomObjectsApi(cluster.api_client).get_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses", out["name"].value)
    assert got["spec"]["extendedResourceName"] == name
    assert set(stack.preview().change_summary) == {"same"}
    stack.destroy()
    eventually(lambda: out["name"].value not in [d["metadata"]["name"] for d in client.CustomObjectsApi(
        cluster.api_client).list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")["items"]],
        "DeviceClass deleted by destroy")


def test_smoke_pod_replaced_while_the_old_one_still_terminates(cluster, project):
    """A smoke pod re-created for a new node name (a worker replaced outside Pulumi, then `refresh` + `up`) while the
    old pod is still terminating: the create must wait for the old pod to be gone. With `pulumi.com/skipAwait` on a
    Pod, pulumi-kubernetes returns from Delete at once (metadata/overrides.go DeletedCondition,
    allowsSkipAwaitWithDelete; pulumi-kubernetes#1232, #3154), and the server-side apply of the new pod then met the
    old pod and failed with a field conflict on .spec.nodeSelector and .spec.tolerations. A finalizer keeps the old
    pod terminating here for a few seconds, deterministically."""
    import threading

    from iks_gpu_migration.components.smoke_pod import smoke_pod
    from iks_gpu_migration.config import SmokeTest

    core = client.CoreV1Api(cluster.api_client)
    namespace, hold = f"smoke-{uuid.uuid4().hex[:6]}", "gpu-migration.test/hold"
    core.create_namespace({"metadata": {"name": namespace}})
    smoke = SmokeTest(image="nvcr.io/nvidia/cuda:12.9.1-base-ubi9", namespace=namespace)
    hostname = {"value": "10.9.1.1"}

    def program():
        import pulumi_kubernetes as k8s
        provider = k8s.Provider("local", kubeconfig=cluster.kubeconfig.read_text())
        pod = smoke_pod("gpu-a", hostname["value"], smoke, "nvidia.com/gpu", ("migration.example.com/gpu-dra", "pilot"),
                        opts=pulumi.ResourceOptions(provider=provider))
        pulumi.export("uid", pod.metadata.uid)

    project.write_stack({})
    stack = project.stack("smoke", program)
    first = stack.up(on_output=print).outputs["uid"].value
    core.patch_namespaced_pod("gpu-smoke-test-gpu-a", namespace, {"metadata": {"finalizers": [hold]}})
    hostname["value"] = "10.9.1.2"

    def release_when_terminating():
        eventually(lambda: core.read_namespaced_pod("gpu-smoke-test-gpu-a", namespace).metadata.deletion_timestamp,
                   "the old smoke pod terminating", timeout=60)
        threading.Event().wait(3)  # the replacement's create runs now if it does not wait for the deletion
        core.patch_namespaced_pod("gpu-smoke-test-gpu-a", namespace, {"metadata": {"finalizers": None}})

    releaser = threading.Thread(target=release_when_terminating, daemon=True)
    releaser.start()
    second = stack.up(on_output=print)
    releaser.join(timeout=60)
    pod = core.read_namespaced_pod("gpu-smoke-test-gpu-a", namespace)
    assert second.outputs["uid"].value == pod.metadata.uid != first
    assert pod.spec.node_selector["kubernetes.io/hostname"] == "10.9.1.2"
    stack.destroy(on_output=print)
    core.delete_namespace(namespace)
