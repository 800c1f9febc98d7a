"""Issue 10 point 10: before a worker is replaced its node is cordoned and its pods evicted through the Eviction API
(PDBs respected, DaemonSet pods skipped, bounded); with a temporary pool, only once its nodes offer GPUs."""
import pytest


from iks_gpu_migration.kube.eviction import EvictionError
from tests.emulators.iks import IksEmulator
from tests.emulators.kube import KubeEmulator
from tests.test_iks_providers import replace
from iks_gpu_migration.iks.api import IksApiError

NODE, TEMP = "10.240.0.21", "10.240.0.50"


@pytest.fixture
def env(tmp_path):
    iks_emu = IksEmulator(master_version="1.36.1_1530").start()
    kube = KubeEmulator().start()
    worker = iks_emu.add_worker(worker_id="w1")
    worker["networkInterfaces"][0]["ipAddress"] = NODE
    kube.add_node(NODE, allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")
    at_replace: list[dict] = []
    original = iks_emu._replace

    def replace_hook(body):  # what the cluster looked like when IKS was asked to replace the worker
        at_replace.append({"pods": sorted(n for (_, n), p in kube.pods.items() if p["spec"].get("nodeName") == NODE),
                           "cordoned": kube.nodes[NODE]["spec"].get("unschedulable")})
        return original(body)
    iks_emu._replace = replace_hook
    settings = {"kubeconfig": kube.write_kubeconfig(tmp_path / "kubeconfig"), "timeout": 5, "poll_interval": 0.01}
    yield iks_emu, kube, settings, at_replace
    kube.stop()
    iks_emu.stop()


def daemonset_pod(kube: KubeEmulator, name: str) -> dict:
    pod = kube.add_pod("gpu-operator", name, node=NODE)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u",
                                           "controller": True}]
    return pod


def test_pods_are_evicted_before_the_replace_respecting_pdbs_and_skipping_daemonsets(env):
    iks_emu, kube, settings, at_replace = env
    kube.add_pod("ml", "training", node=NODE, requests={"nvidia.com/gpu": "1"})
    guarded = kube.add_pod("ml", "inference", node=NODE)
    guarded["metadata"]["labels"] = {"app": "inference"}
    pdb = kube.add_pdb("ml", "inference", {"app": "inference"}, disruptions_allowed=0)
    kube.after(5, "/eviction", lambda: pdb["status"].update(disruptionsAllowed=1))  # another replica got ready
    daemonset_pod(kube, "nvidia-device-plugin-abc")
    kube.add_pod("ml", "done", node=NODE, phase="Succeeded")
    replace(iks_emu, "w1", evict=settings)
    assert at_replace == [{"pods": ["done", "nvidia-device-plugin-abc"], "cordoned": True}]
    evictions = [p for m, p in kube.requests if m == "POST" and p.endswith("/eviction")]
    assert evictions.count("/api/v1/namespaces/ml/pods/inference/eviction") >= 2  # 429, retried
    assert not [p for p in evictions if "nvidia-device-plugin" in p or "/done/" in p]
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_a_pdb_that_never_allows_stops_before_the_replace(env):
    iks_emu, kube, settings, _ = env
    pod = kube.add_pod("ml", "inference", node=NODE)
    pod["metadata"]["labels"] = {"app": "inference"}
    kube.add_pdb("ml", "inference", {"app": "inference"}, disruptions_allowed=0)
    with pytest.raises(EvictionError) as raised:
        replace(iks_emu, "w1", evict={**settings, "timeout": 0.2})
    message = str(raised.value)
    assert "ml/inference" in message and "disruption budget" in message and "left cordoned" in message
    assert f"kubectl uncordon {NODE}" in message
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0
    assert iks_emu.workers["w1"]["lifecycle"]["actualState"] == "deployed"


def test_the_temp_pool_must_offer_gpus_before_the_node_is_drained(env):
    iks_emu, kube, settings, at_replace = env
    kube.add_node(TEMP, kubelet_version="v1.36.1+IKS")  # the temporary pool's node, operator not ready yet
    kube.add_pod("ml", "training", node=NODE, requests={"nvidia.com/gpu": "1"})
    seen_at_eviction: list[str] = []
    original = kube._evict

    def evict_hook(namespace, name, **kwargs):
        seen_at_eviction.append(kube.nodes[TEMP]["status"]["allocatable"].get("nvidia.com/gpu", "0"))
        return original(namespace, name, **kwargs)
    kube._evict = evict_hook
    kube.after(4, f"/api/v1/nodes/{TEMP}", lambda: kube.nodes[TEMP]["status"]["allocatable"].update(
        {"nvidia.com/gpu": "1"}))
    replace(iks_emu, "w1", evict={**settings, "gpu_nodes": [TEMP], "gpu_resources": ["nvidia.com/gpu"]})
    assert seen_at_eviction == ["1"] and at_replace[0]["pods"] == []


def test_temp_pool_without_gpus_stops_before_anything_is_drained(env):
    iks_emu, kube, settings, _ = env
    kube.add_node(TEMP, kubelet_version="v1.36.1+IKS")
    kube.add_pod("ml", "training", node=NODE)
    with pytest.raises(EvictionError, match=rf"GPUs on the nodes that take the workloads \({TEMP}.*no GPUs "
                                            r"allocatable.*nothing was drained or replaced"):
        replace(iks_emu, "w1", evict={**settings, "timeout": 0.2, "gpu_nodes": [TEMP]})
    assert "unschedulable" not in kube.nodes[NODE]["spec"] and ("ml", "training") in kube.pods
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0


def test_a_node_already_at_target_is_not_drained(env):
    iks_emu, kube, settings, _ = env
    iks_emu.workers["w1"]["kubeVersion"]["actual"] = "1.36.1_1530"
    kube.add_pod("ml", "training", node=NODE)
    assert replace(iks_emu, "w1", evict=settings)["new_worker_id"] == "w1"
    assert ("ml", "training") in kube.pods and "unschedulable" not in kube.nodes[NODE]["spec"]


def test_eviction_answers_like_the_real_subresource(tmp_path):
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    kube = KubeEmulator().start()
    try:
        for name in ("a", "b"):
            kube.add_pod("ml", name, node=NODE)["metadata"]["labels"] = {"app": "x"}
        kube.add_pdb("ml", "x", {"app": "x"}, disruptions_allowed=1)
        with config.new_client_from_config(config_file=kube.write_kubeconfig(tmp_path / "k")) as api:
            core = client.CoreV1Api(api)
            body = lambda n: client.V1Eviction(api_version="policy/v1", kind="Eviction", metadata=client.V1ObjectMeta(name=n, namespace="ml"))
            core.create_namespaced_pod_eviction("a", "ml", body("a"))
            with pytest.raises(ApiException) as raised:
                core.create_namespaced_pod_eviction("b", "ml", body("b"))
            assert raised.value.status == 429 and "disruption budget" in raised.value.body
            with pytest.raises(ApiException) as gone:
                core.create_namespaced_pod_eviction("a", "ml", body("a"))
            assert gone.value.status == 404
    finally:
        kube.stop()


def test_a_refused_replace_after_the_drain_says_the_node_is_cordoned(env):
    iks_emu, kube, settings, _ = env
    iks_emu.refuse_replace["w1"] = (409, "The worker node cannot be replaced while the pool is rebalancing.")
    with pytest.raises(IksApiError, match=rf"worker w1 is unchanged.*rebalancing.*node {NODE} was cordoned and "
                                              rf"drained.*kubectl uncordon {NODE}"):
        replace(iks_emu, "w1", evict=settings)
    assert kube.nodes[NODE]["spec"]["unschedulable"] is True
