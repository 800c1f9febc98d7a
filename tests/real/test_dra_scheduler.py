"""First proof: the real kube-scheduler allocates DRA-backed extended resources (KEP-5004) on the local control plane.

A pod requesting the extended resource lands on a node through the DeviceClass and the ResourceSlices, and the
scheduler itself sets `status.extendedResourceClaimStatus` naming an allocated claim; a node that still offers the
resource through the device plugin gets no DRA allocation.
"""
import uuid

from kubernetes import client

from gpu_migration_local.gpu_doubles import gpu_uuid

from .kube import GPU_PRESENT, eventually, kwok_node

RESOURCE = "nvidia.com/gpu"


def _plugin_pod(node: str, ns: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"nvidia-dra-driver-gpu-kubelet-plugin-{node.replace('.', '-')}", "namespace": ns},
            "spec": {"nodeName": node, "containers": [{"name": "gpus", "image": "dra"}]}}


def _gpu_pod(name: str, ns: str, node_selector: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"restartPolicy": "Never", "nodeSelector": node_selector,
                     "containers": [{"name": "cuda", "image": "cuda", "command": ["nvidia-smi", "-L"],
                                     "resources": {"limits": {RESOURCE: "1"}}}]}}


def test_real_scheduler_allocates_extended_resource_through_dra(cluster):
    core = client.CoreV1Api(cluster.api_client)
    custom = client.CustomObjectsApi(cluster.api_client)
    suffix = uuid.uuid4().hex[:6]
    ns = f"proof-{suffix}"
    core.create_namespace({"metadata": {"name": ns}})
    dra_node, dp_node = f"dra-{suffix}", f"dp-{suffix}"
    core.create_node(kwok_node(dra_node, {GPU_PRESENT: "true", "proof": suffix, "path": "dra"}))
    # The device-plugin node runs IBM's plugin (nvidia.com/gpu allocatable) AND a DRA plugin: DRA must not be used.
    core.create_node(kwok_node(dp_node, {GPU_PRESENT: "true", "proof": suffix, "path": "dp"},
                               {"gpu-migration.local/ibm-managed-driver": "true"}))
    for n in (dra_node, dp_node):
        core.create_namespaced_pod(ns, _plugin_pod(n, ns))
    eventually(lambda: core.read_node(dp_node).status.allocatable.get(RESOURCE) == "1",
               "device plugin allocatable on the device-plugin node")
    eventually(lambda: len({s["spec"]["nodeName"] for s in custom.list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices")["items"]} & {dra_node, dp_node}) == 2, "slices on both nodes")
    class_name = f"proof-{suffix}"
    custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": class_name},
        "spec": {"extendedResourceName": RESOURCE, "selectors": [{"cel": {"expression":
                 "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}})
    try:
        # Only the DRA node can take it without the device plugin: the scheduler must go through DRA.
        core.create_namespaced_pod(ns, _gpu_pod("via-dra", ns, {"proof": suffix, "path": "dra"}))
        pod = eventually(lambda: (p := core.read_namespaced_pod("via-dra", ns)).spec.node_name and
                         p.status.extended_resource_claim_status and p, "via-dra scheduled with a DRA claim")
        assert pod.spec.node_name == dra_node
        claim_name = pod.status.extended_resource_claim_status.resource_claim_name
        mapping = pod.status.extended_resource_claim_status.request_mappings[0]
        assert (mapping.container_name, mapping.resource_name) == ("cuda", RESOURCE)
        claim = custom.get_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", claim_name)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == ("gpu.nvidia.com", dra_node, "gpu-0")
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        # The nvidia-smi double prints the allocated device's UUID, read back through the API server's log proxy.
        eventually(lambda: core.read_namespaced_pod("via-dra", ns).status.phase == "Succeeded", "via-dra done")
        log = core.read_namespaced_pod_log("via-dra", ns, container="cuda")
        assert f"GPU 0: NVIDIA L4 (UUID: {gpu_uuid(dra_node, 0)})" in log, log  # no flavor label: the local L4

        # Same name on both paths: with device-plugin allocatable > 0, the scheduler uses the plugin, not DRA.
        core.create_namespaced_pod(ns, _gpu_pod("via-plugin", ns, {"proof": suffix, "path": "dp"}))
        pod = eventually(lambda: (p := core.read_namespaced_pod("via-plugin", ns)).spec.node_name and p,
                         "via-plugin scheduled")
        assert pod.spec.node_name == dp_node
        assert pod.status.extended_resource_claim_status is None
        claims = custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims")["items"]
        owners = {o["name"] for c in claims for o in c["metadata"].get("ownerReferences", [])}
        assert "via-plugin" not in owners, "the device-plugin pod must get no DRA claim"
        # kube-controller-manager's resourceclaim controller removes the claim of a finished pod.
        eventually(lambda: claim_name not in [c["metadata"]["name"] for c in custom.list_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims")["items"]], "the finished pod's claim removed")
    finally:
        custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", class_name)
        core.delete_namespace(ns)
        for n in (dra_node, dp_node):
            core.delete_node(n)
