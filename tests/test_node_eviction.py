"""Issue 10 point 10: before a worker is replaced its node is cordoned and its pods evicted through the Eviction API
(PDBs respected, DaemonSet pods skipped, bounded); with a temporary pool, only once its nodes offer GPUs. Against the
real API server (tests/envtest.py): its eviction subresource judges the PodDisruptionBudgets."""
import uuid

import pytest


from iks_gpu_migration.kube.eviction import EvictionError
from tests.emulators.iks import IksEmulator
from tests.envtest import eventually
from tests.test_iks_providers import replace
from iks_gpu_migration.iks.api import IksApiError



@pytest.fixture
def env(kube):
    """The IKS emulator's worker w1 is node NODE (prefixed: node names are cluster-wide on the shared server)."""
    node = kube.name("10.240.0.21")
    iks_emu = IksEmulator(master_version="1.36.1_1530").start()
    worker = iks_emu.add_worker(worker_id="w1")
    worker["networkInterfaces"][0]["ipAddress"] = node
    kube.add_node(node, allocatable={"nvidia.com/gpu": "1"}, kubelet_version="v1.35.4+IKS")
    at_replace: list[dict] = []
    original = iks_emu._replace

    def replace_hook(body):  # what the cluster looked like when IKS was asked to replace the worker
        pods = kube.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        at_replace.append({"pods": sorted(p.metadata.name for p in pods), "cordoned": kube.unschedulable(node)})
        return original(body)
    iks_emu._replace = replace_hook
    settings = {"kubeconfig": kube.kubeconfig, "timeout": 5, "poll_interval": 0.01}
    yield iks_emu, kube, settings, at_replace, node
    iks_emu.stop()


def running(kube, name: str, node: str, **kwargs) -> dict:
    """A Running, Ready pod of a ReplicaSet in the test's namespace `ml` (a PDB guards only a ready pod)."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": str(uuid.uuid4()), "controller": True}
    return kube.add_pod(kube.ns("ml"), name, node=node, owner=owner, **kwargs)


def daemonset_pod(kube, name: str, node: str) -> dict:
    """A pod of a DaemonSet that exists (the drain skips only those, as kubectl drain's daemonSetFilter)."""
    from kubernetes import client
    ns = kube.ns("gpu-operator")
    ds = client.AppsV1Api(kube.api).create_namespaced_daemon_set(ns, {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"},
        "spec": {"selector": {"matchLabels": {"app": "ds"}}, "template": {
            "metadata": {"labels": {"app": "ds"}}, "spec": {"containers": [{"name": "c", "image": "img"}]}}}})
    owner = {**kube.daemonset_owner("ds"), "uid": ds.metadata.uid}
    return kube.add_pod(ns, name, node=node, owner=owner)


def test_pods_are_evicted_before_the_replace_respecting_pdbs_and_skipping_daemonsets(env, monkeypatch):
    from kubernetes import client
    iks_emu, kube, settings, at_replace, node = env
    ml = kube.ns("ml")
    running(kube, "training", node, requests={"nvidia.com/gpu": "1"})
    running(kube, "inference", node, labels={"app": "inference"})
    kube.add_pdb(ml, "inference", {"app": "inference"}, disruptions_allowed=0)
    requests = kube.record(monkeypatch)
    # After five eviction answers another replica got ready: the disruption controller would allow one.
    kube.after_calls(monkeypatch, client.CoreV1Api, "create_namespaced_pod_eviction", 5,
                     lambda: kube.set_pdb_allowed(ml, "inference", 1))
    daemonset_pod(kube, "nvidia-device-plugin-abc", node)
    running(kube, "done", node, phase="Succeeded", exit_code=0)
    replace(iks_emu, "w1", evict=settings)
    # The finished pod is deleted (not evicted: it disrupts nothing), the DaemonSet's pod stays.
    assert at_replace == [{"pods": ["nvidia-device-plugin-abc"], "cordoned": True}]
    assert ("DELETE", f"/api/v1/namespaces/{ml}/pods/done") in requests
    evictions = [p for m, p in requests if m == "POST" and p.endswith("/eviction")]
    assert evictions.count(f"/api/v1/namespaces/{ml}/pods/inference/eviction") >= 2  # 429, retried
    assert not [p for p in evictions if "nvidia-device-plugin" in p or "/done/" in p]
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 1


def test_a_pdb_that_never_allows_stops_before_the_replace(env):
    iks_emu, kube, settings, _, node = env
    ml = kube.ns("ml")
    running(kube, "inference", node, labels={"app": "inference"})
    kube.add_pdb(ml, "inference", {"app": "inference"}, disruptions_allowed=0)
    with pytest.raises(EvictionError) as raised:
        replace(iks_emu, "w1", evict={**settings, "timeout": 0.2})
    message = str(raised.value)
    assert f"{ml}/inference" in message and f"PodDisruptionBudget {ml}/inference allows 0 disruptions" in message
    assert not kube.unschedulable(node)  # this run's cordon is undone: nothing was replaced
    assert kube.pod(ml, "inference")["metadata"].get("deletionTimestamp") is None  # never evicted
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0
    assert iks_emu.workers["w1"]["lifecycle"]["actualState"] == "deployed"


def test_the_temp_pool_must_offer_gpus_before_the_node_is_drained(env, monkeypatch):
    from kubernetes import client

    from iks_gpu_migration.kube import eviction as node_eviction
    iks_emu, kube, settings, at_replace, node = env
    temp = kube.name("10.240.0.50")
    kube.add_node(temp, kubelet_version="v1.36.1+IKS")  # the temporary pool's node, operator not ready yet
    running(kube, "training", node, requests={"nvidia.com/gpu": "1"})
    seen_at_eviction: list[str] = []
    real = client.CoreV1Api.create_namespaced_pod_eviction

    def evict_hook(self, *args, **kwargs):
        seen_at_eviction.append(kube.allocatable(temp).get("nvidia.com/gpu", "0"))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(client.CoreV1Api, "create_namespaced_pod_eviction", evict_hook)
    # The GPU Operator comes up on the temporary node while the drain waits for it (its fourth look).
    kube.after_calls(monkeypatch, node_eviction, "gpus_offered", 3,
                     lambda: kube.set_allocatable(temp, {"nvidia.com/gpu": "1"}))
    replace(iks_emu, "w1", evict={**settings, "gpu_nodes": [temp], "gpu_resources": ["nvidia.com/gpu"]})
    # Every eviction came after the temporary node offered GPUs. (The drain may evict a pod again while its graceful
    # deletion is still under way: the real subresource lets a terminating pod go again.)
    assert seen_at_eviction and set(seen_at_eviction) == {"1"} and at_replace[0]["pods"] == []


def test_temp_pool_without_gpus_stops_before_anything_is_drained(env):
    iks_emu, kube, settings, _, node = env
    temp = kube.name("10.240.0.50")
    kube.add_node(temp, kubelet_version="v1.36.1+IKS")
    running(kube, "training", node)
    with pytest.raises(EvictionError, match=rf"GPUs on the nodes that take the workloads \({temp}.*no GPUs "
                                            r"allocatable.*nothing was drained or replaced"):
        replace(iks_emu, "w1", evict={**settings, "timeout": 0.2, "gpu_nodes": [temp]})
    assert not kube.unschedulable(node)
    assert kube.pod(kube.ns("ml"), "training")["metadata"].get("deletionTimestamp") is None
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0


def test_a_node_already_at_target_is_not_drained(env):
    iks_emu, kube, settings, _, node = env
    iks_emu.workers["w1"]["kubeVersion"]["actual"] = "1.36.1_1530"
    running(kube, "training", node)
    assert replace(iks_emu, "w1", evict=settings)["new_worker_id"] == "w1"
    assert kube.pod(kube.ns("ml"), "training")["metadata"].get("deletionTimestamp") is None
    assert not kube.unschedulable(node)


def test_the_eviction_subresource_answers_as_the_drain_expects(kube):
    """What kube/eviction.py relies on, from the real server: a budget with no disruption left answers 429 naming the
    disruption budget (retried), one that allows a disruption evicts; a pod that is gone answers 404 (skipped)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    node, ml = kube.name("n1"), kube.ns("ml")
    kube.add_node(node)
    for name in ("a", "b"):
        running(kube, name, node, labels={"app": "x"})
    kube.add_pdb(ml, "x", {"app": "x"}, disruptions_allowed=1)
    core = client.CoreV1Api(kube.api)

    def body(n):
        return client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                 metadata=client.V1ObjectMeta(name=n, namespace=ml))
    core.create_namespaced_pod_eviction("a", ml, body("a"))
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod_eviction("b", ml, body("b"))
    assert raised.value.status == 429 and "disruption budget" in raised.value.body
    assert "DisruptionBudget" in raised.value.body
    eventually(lambda: kube.pod_or_none(ml, "a") is None, "pod a gone (its graceful deletion finished)")
    with pytest.raises(ApiException) as gone:
        core.create_namespaced_pod_eviction("a", ml, body("a"))
    assert gone.value.status == 404


def test_a_refused_replace_after_the_drain_says_the_node_is_cordoned(env):
    iks_emu, kube, settings, _, node = env
    iks_emu.refuse_replace["w1"] = (409, "The worker node cannot be replaced while the pool is rebalancing.")
    with pytest.raises(IksApiError, match=rf"worker w1 is unchanged.*rebalancing.*node {node} was drained before "
                                              rf"the request and is uncordoned again"):
        replace(iks_emu, "w1", evict=settings)
    assert not kube.unschedulable(node)


def test_throttling_is_told_from_a_budget_and_its_retry_after_is_honoured(kube, monkeypatch):
    """API Priority and Fairness answers 429 with Retry-After and no DisruptionBudget cause (k8s.io/apiserver
    pkg/server/filters/priority-and-fairness.go, tooManyRequests): played twice in front of the real subresource."""
    import json
    import time

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from iks_gpu_migration.kube.eviction import drain
    node = kube.name("n1")
    kube.add_node(node)
    running(kube, "web", node)
    real, posts = client.CoreV1Api.create_namespaced_pod_eviction, []

    def throttled(api, name, namespace, body, **kw):
        posts.append(time.monotonic())
        if len(posts) <= 2:
            e = ApiException(status=429, reason="Too Many Requests")
            e.headers = {"Retry-After": "1"}
            e.body = json.dumps({"message": "Too many requests, please try again later."})
            raise e
        return real(api, name, namespace, body, **kw)
    monkeypatch.setattr(client.CoreV1Api, "create_namespaced_pod_eviction", throttled)
    logged: list[str] = []
    monkeypatch.setattr("pulumi.log.info", lambda msg, *a, **k: logged.append(msg))
    result = drain(node, {"kubeconfig": kube.kubeconfig, "timeout": 10, "poll_interval": 0.01})
    assert result["evicted"] == [f"{kube.ns('ml')}/web"] and len(posts) == 3
    assert posts[1] - posts[0] >= 1 and posts[2] - posts[1] >= 1  # never before Retry-After, though polled at 10 ms
    assert any("API server throttling (429 without a PodDisruptionBudget cause, Retry-After 1s)" in m for m in logged)


def test_a_403_in_a_terminating_namespace_is_retried_until_the_pod_is_gone(kube, monkeypatch):
    """The real NamespaceLifecycle admission refuses the eviction (a create) in a terminating namespace with cause
    NamespaceTerminating; kubectl drain retries it. No namespace controller here: the test deletes the pod as it
    would, after the drain met the 403 twice."""
    from kubernetes import client
    node, ml = kube.name("n1"), kube.ns("ml")
    kube.add_node(node)
    running(kube, "web", node)
    client.CoreV1Api(kube.api).delete_namespace(ml)
    eventually(lambda: client.CoreV1Api(kube.api).read_namespace(ml).status.phase == "Terminating", "ns terminating")
    answers: list[int] = []
    real = client.CoreV1Api.create_namespaced_pod_eviction

    def recording(api, name, namespace, body, **kw):
        try:
            return real(api, name, namespace, body, **kw)
        except Exception as e:
            answers.append(e.status)
            if len(answers) == 2:
                client.CoreV1Api(kube.api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            raise
    monkeypatch.setattr(client.CoreV1Api, "create_namespaced_pod_eviction", recording)
    from iks_gpu_migration.kube.eviction import drain
    result = drain(node, {"kubeconfig": kube.kubeconfig, "timeout": 10, "poll_interval": 0.01})
    # Retried, not fatal; once the namespace controller's delete took the pod, the drain is done.
    assert answers == [403, 403] and result["evicted"] == [] and kube.pod_or_none(ml, "web") is None


def test_a_run_that_stops_after_the_drain_but_before_the_replace_request_uncordons_the_node(env, monkeypatch):
    """E.g. the worker leaves `deployed` right after the drain (IKS started something else on it): the replace is
    never requested, the wait for it times out, and the drain's cordon is undone."""
    from iks_gpu_migration.common.waiting import WaitTimeout
    from iks_gpu_migration.kube import eviction
    iks_emu, kube, settings, _, node = env
    running(kube, "web", node)
    real = eviction.drain

    def drain_then_busy(name, evict):
        result = real(name, evict)
        assert kube.unschedulable(node)  # drained and cordoned
        iks_emu.workers["w1"]["lifecycle"]["actualState"] = "reloading"
        return result
    monkeypatch.setattr(eviction, "drain", drain_then_busy)
    with pytest.raises(WaitTimeout, match="worker w1 was not replaced"):
        replace(iks_emu, "w1", evict=settings, timeout=0.5)
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0 and not kube.unschedulable(node)


def test_a_resumed_replacement_reports_what_the_killed_runs_drain_moved(env):
    """Killed after the drain and its request: the resumed create's output still says what went (the record the
    drain left on the old node)."""
    import json

    from iks_gpu_migration.kube.records import DRAIN_ANNOTATION
    iks_emu, kube, settings, _, node = env
    record = {"evicted": ["ml/web-1"], "at": "2026-12-03T12:00:00Z"}
    kube.patch_node(node, {"metadata": {"annotations": {DRAIN_ANNOTATION: json.dumps(record)}}})
    iks_emu.route("POST", "/v2/vpc/replaceWorker", {}, {"cluster": "gpu-cluster", "workerID": "w1", "update": True})
    assert replace(iks_emu, "w1", evict=settings)["drained"] == record
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0  # not requested again (the killed run's request
    # went to the emulator directly, uncounted)
