"""The GPU doubles of the local environment report the GPU of the node's IKS flavor (gpu_migration_local/gpu_doubles.py)."""
import pytest

from gpu_migration_local.gpu_doubles import gpu_model


@pytest.mark.parametrize("flavor, name, memory", [
    ("gx3.16x80.l4", "NVIDIA L4", "24Gi"),
    ("gx3.24x120.l40s", "NVIDIA L40S", "48Gi"),
    ("gx3d.160x1792.8h100", "NVIDIA H100 80GB HBM3", "80Gi"),
    ("gx2.8x64.1v100", "Tesla V100-PCIE-16GB", "16Gi"),
    ("", "NVIDIA L4", "24Gi"),  # no flavor label: the local workers' L4
])
def test_gpu_of_each_flavor(flavor, name, memory):
    model = gpu_model(flavor)
    assert (model.name, model.memory) == (name, memory)


def test_a_node_deleted_during_a_pass_does_not_hold_back_the_others():
    """A replaced worker's node goes while the doubles' pass runs: NFD's labels still reach every other node in that
    pass (a 404 used to end the pass, so every other node waited a poll interval more)."""
    from kubernetes import client

    from gpu_migration_local.gpu_doubles import GPUS_ANNOTATION, GpuDoubles
    from gpu_migration_local.kubelet_logs import LogStore

    class Core:
        def __init__(self):
            self.patched: dict[str, dict] = {}

        def patch_node(self, name, body):
            if name == "gone":
                raise client.ApiException(status=404, reason="Not Found")
            self.patched[name] = body

    def node(name):
        info = client.V1NodeSystemInfo(
            architecture="amd64", boot_id="", container_runtime_version="", kernel_version="6.8.0-88-generic",
            kube_proxy_version="", kubelet_version="v1.37.0", machine_id="", operating_system="linux",
            os_image="Ubuntu 24.04.3 LTS", system_uuid="")
        return client.V1Node(metadata=client.V1ObjectMeta(name=name, annotations={GPUS_ANNOTATION: "1"}),
                             status=client.V1NodeStatus(node_info=info))

    def nfd_worker(on):
        return client.V1Pod(metadata=client.V1ObjectMeta(labels={"role": "worker",
                                                                 "app.kubernetes.io/name": "node-feature-discovery"}),
                            spec=client.V1PodSpec(node_name=on, containers=[]),
                            status=client.V1PodStatus(phase="Running"))

    doubles = GpuDoubles(client.ApiClient(), LogStore())
    doubles.core = Core()
    doubles._nfd_labels({n: node(n) for n in ("gone", "a", "b")}, [nfd_worker(n) for n in ("gone", "a", "b")])
    assert set(doubles.core.patched) == {"a", "b"}
    assert doubles.core.patched["a"]["metadata"]["labels"]["feature.node.kubernetes.io/pci-10de.present"] == "true"
