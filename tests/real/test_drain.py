"""The drain before a worker replacement (kube/eviction.py) on the real local control plane: the real Eviction API,
PodDisruptionBudgets whose status the real disruption controller computes, real Deployments, ReplicaSets and
DaemonSets, pods run by kwok. One test per rule of `kubectl drain` the drain follows (issue 17, point 1)."""
import json
import threading
import time
import uuid

import pytest
from kubernetes import client

from iks_gpu_migration.kube.cordon import CORDON_ANNOTATION
from iks_gpu_migration.kube.eviction import EvictionError, drain
from iks_gpu_migration.kube.records import DRAIN_ANNOTATION

from .kube import ReadyReplicas, eventually, kwok_node

UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}


class Env:
    """A namespace and two kwok nodes of this test: `node` is drained, `spare` takes what is evicted."""

    def __init__(self, cluster) -> None:
        self.api = cluster.api_client
        self.core, self.apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.id = uuid.uuid4().hex[:6]
        self.ns, self.node, self.spare = f"drain-{self.id}", f"drain-{self.id}-a", f"drain-{self.id}-b"
        self.kubeconfig = str(cluster.kubeconfig)
        self.core.create_namespace({"metadata": {"name": self.ns}})
        for name in (self.node, self.spare):
            self.core.create_node(kwok_node(name, {"drain-test": self.id}))
        eventually(lambda: all(_ready(self.core.read_node(n)) for n in (self.node, self.spare)), "kwok nodes Ready")

    def settings(self, timeout: float = 30, **drain_options) -> dict:
        return {"kubeconfig": self.kubeconfig, "timeout": timeout, "poll_interval": 0.2, "drain": drain_options}

    def pod(self, name: str, node: str = "", labels: dict | None = None, **spec) -> client.V1Pod:
        """A bare pod bound to `node` (the drained one by default), run by kwok."""
        body = {"metadata": {"name": name, "labels": labels or {}},
                "spec": {"nodeName": node or self.node, "containers": [{"name": "c", "image": "img"}], **spec}}
        self.core.create_namespaced_pod(self.ns, body)
        return eventually(lambda: (p := self.core.read_namespaced_pod(name, self.ns)).status.phase == "Running" and p,
                          f"pod {name} Running")

    def bound(self, name: str, replicas: int = 1, node: str = "", running: bool = True, **pod_spec) -> list[str]:
        """A Deployment whose pods are bound to `node` (the drained one by default) by their template: pods a
        controller re-creates, on that same node. Returns the pods' names."""
        self.apps.create_namespaced_deployment(self.ns, {"metadata": {"name": name}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "nodeName": node or self.node, "containers": [{"name": "c", "image": "img"}], **pod_spec}}}})
        pods = eventually(lambda: len(ps := [p for p in self.core.list_namespaced_pod(
            self.ns, label_selector=f"app={name}").items if p.status.phase == ("Running" if running else "Pending")])
            == replicas and ps, f"{replicas} pods of {name}")
        return [p.metadata.name for p in pods]

    def deployment(self, name: str, replicas: int, node_selector: dict | None = None, tolerations=None,
                   **pod_spec) -> None:
        self.apps.create_namespaced_deployment(self.ns, {"metadata": {"name": name}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "nodeSelector": node_selector or {"drain-test": self.id}, "tolerations": tolerations or [],
                "containers": [{"name": "c", "image": "img"}], **pod_spec}}}})
        eventually(lambda: (self.apps.read_namespaced_deployment(name, self.ns).status.ready_replicas or 0)
                   == replicas, f"deployment {name} ready")

    def on(self, node: str, label: str = "") -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(self.ns, field_selector=f"spec.nodeName={node}").items
        return [p for p in pods if not label or label in (p.metadata.labels or {}).values()]

    def cordoned(self) -> bool:
        return bool(self.core.read_node(self.node).spec.unschedulable)

    def count_evictions(self, monkeypatch) -> list[str]:
        posted: list[str] = []
        real = client.CoreV1Api.create_namespaced_pod_eviction

        def counting(api, name, namespace, body, **kw):
            posted.append(f"{namespace}/{name}")
            return real(api, name, namespace, body, **kw)
        monkeypatch.setattr(client.CoreV1Api, "create_namespaced_pod_eviction", counting)
        return posted

    def close(self) -> None:
        for pod in self.core.list_namespaced_pod(self.ns).items:
            if pod.metadata.finalizers:
                self.core.patch_namespaced_pod(pod.metadata.name, self.ns, {"metadata": {"finalizers": None}})
        self.core.delete_namespace(self.ns)
        for name in (self.node, self.spare):
            self.core.delete_node(name)


def _ready(node: client.V1Node) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


@pytest.fixture
def env(cluster):
    e = Env(cluster)
    yield e
    e.close()


def test_bare_and_emptydir_pods_stop_the_drain_before_anything_is_evicted(env, monkeypatch):
    env.deployment("web", 1, {"kubernetes.io/hostname": env.node})
    env.pod("notebook")
    cache = env.bound("cache", volumes=[{"name": "scratch", "emptyDir": {}}])[0]
    posted = env.count_evictions(monkeypatch)
    with pytest.raises(EvictionError) as raised:
        drain(env.node, env.settings())
    message = str(raised.value)
    assert f"{env.ns}/notebook: declares no controller" in message and "drain.force: true" in message
    assert f"{env.ns}/{cache}: emptyDir volume scratch" in message and "drain.deleteEmptyDirData: true" in message
    assert "Nothing was evicted" in message and f"{env.ns}/web-" not in message  # the Deployment's pod may go
    assert posted == [] and not [p for p in env.on(env.node) if p.metadata.deletion_timestamp]
    assert not env.cordoned()  # this drain's cordon is undone: nothing was replaced
    # Opted in, the same node drains; what went is recorded on it.
    result = drain(env.node, env.settings(force=True, delete_empty_dir_data=True))
    assert f"{env.ns}/notebook" in result["evicted"] and f"{env.ns}/{cache}" in result["evicted"]
    record = json.loads(env.core.read_node(env.node).metadata.annotations[DRAIN_ANNOTATION])
    assert sorted(record["evicted"]) == sorted(result["evicted"]) and len(result["evicted"]) == 3


def test_daemonset_pods_stay_while_their_daemonset_exists_mirror_pods_stay_finished_pods_are_deleted(env):
    env.apps.create_namespaced_daemon_set(env.ns, {"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": env.node}, "tolerations": [UNSCHEDULABLE],
            "containers": [{"name": "c", "image": "img"}]}}}})
    eventually(lambda: [p for p in env.on(env.node, "agent") if p.status.phase == "Running"], "DaemonSet pod running")
    mirror = {"metadata": {"name": "static", "annotations": {"kubernetes.io/config.mirror": "hash"}},
              "spec": {"nodeName": env.node, "containers": [{"name": "c", "image": "img"}]}}
    env.core.create_namespaced_pod(env.ns, mirror)
    client.BatchV1Api(env.api).create_namespaced_job(env.ns, {"metadata": {"name": "done"}, "spec": {
        "template": {"spec": {"nodeName": env.node, "restartPolicy": "Never",
                              "containers": [{"name": "c", "image": "img"}]}}}})
    eventually(lambda: [p for p in env.on(env.node) if p.metadata.name.startswith("done-")
                        and p.status.phase == "Succeeded"], "job pod Succeeded")
    result = drain(env.node, env.settings())
    assert result["evicted"] == [] and [d.split("/")[1][:5] for d in result["deleted"]] == ["done-"]
    left = sorted(p.metadata.name.split("-")[0] for p in env.on(env.node))
    assert left == ["agent", "static"]
    assert any("DaemonSet agent keeps it" in s for s in result["skipped"])
    assert any("static" in s and "mirror" in s for s in result["skipped"])


def test_the_drain_waits_for_the_pods_it_evicted_not_for_an_empty_node(env):
    """A workload that tolerates the cordon comes straight back to the node: named, not waited for. (The evicted pod
    is held by a finalizer until its successor runs on the node, so the drain's last look always sees it.)"""
    env.deployment("sticky", 1, {"kubernetes.io/hostname": env.node}, tolerations=[UNSCHEDULABLE])
    first = env.on(env.node, "sticky")[0]
    env.core.patch_namespaced_pod(first.metadata.name, env.ns, {"metadata": {"finalizers": ["example.com/hold"]}})

    def release_once_back():
        eventually(lambda: [p for p in env.on(env.node, "sticky")
                            if p.metadata.uid != first.metadata.uid and p.status.phase == "Running"],
                   "the evicted pod's successor running on the cordoned node", timeout=60)
        env.core.patch_namespaced_pod(first.metadata.name, env.ns, {"metadata": {"finalizers": None}})
    releaser = threading.Thread(target=release_once_back, daemon=True)
    releaser.start()
    started = time.monotonic()
    result = drain(env.node, env.settings(timeout=120))
    releaser.join()
    assert time.monotonic() - started < 60  # it did not wait out its bound for the comeback
    assert result["evicted"] == [f"{env.ns}/{first.metadata.name}"]
    assert len(result["cameBack"]) == 1 and result["cameBack"][0] != result["evicted"][0]


def test_pods_on_a_notready_node_are_evicted_once_and_not_awaited(cluster, env, monkeypatch):
    """No kubelet finishes them (a node kwok does not play, NotReady): each pod gets one eviction, then the drain
    says it does not wait for it; the worker goes anyway."""
    dead = f"drain-{env.id}-dead"
    node = kwok_node(dead, {"drain-test": env.id})
    del node["metadata"]["annotations"]["kwok.x-k8s.io/node"]
    node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
    env.core.create_node(node)
    try:
        pods = env.bound("web", 2, node=dead, running=False)  # bound, never started: no kubelet
        posted = env.count_evictions(monkeypatch)
        result = drain(dead, env.settings(timeout=20))
        assert sorted(posted) == sorted(f"{env.ns}/{n}" for n in pods)  # once each, not re-posted while terminating
        assert sorted(result["notAwaited"]) == sorted(f"{env.ns}/{n} (node NotReady: its kubelet will not finish it)"
                                                      for n in pods)
        assert all(env.core.read_namespaced_pod(n, env.ns).metadata.deletion_timestamp for n in pods)
    finally:
        env.core.delete_node(dead)


def test_a_pod_terminating_past_skip_wait_for_delete_timeout_is_not_awaited(env):
    # As kubectl, the time counts from the deletionTimestamp: the end of the pod's grace period.
    slow = env.bound("slow", terminationGracePeriodSeconds=1)[0]
    env.core.patch_namespaced_pod(slow, env.ns, {"metadata": {"finalizers": ["example.com/hold"]}})
    result = drain(env.node, env.settings(timeout=30, skip_wait_for_delete_timeout=2))
    assert len(result["notAwaited"]) == 1 and result["notAwaited"][0].startswith(f"{env.ns}/{slow} (terminating for ")
    assert result["notAwaited"][0].endswith("past drain.skipWaitForDeleteTimeout)")
    node = env.core.read_node(env.node)  # drained, its replace next: cordoned, marked as the drain's
    assert node.spec.unschedulable and node.metadata.annotations[CORDON_ANNOTATION] == "worker-replacement"
    with pytest.raises(EvictionError, match=rf"{env.ns}/{slow} \(terminating\)"):  # without it: bounded, named
        drain(env.node, env.settings(timeout=2))


def test_a_budget_is_named_with_its_allowed_disruptions_and_a_budget_that_allows_one_lets_the_drain_go(env):
    env.core.patch_node(env.spare, {"spec": {"unschedulable": True}})  # both replicas start on the drained node
    env.deployment("web", 2)
    env.policy.create_namespaced_pod_disruption_budget(env.ns, {"metadata": {"name": "web"}, "spec": {
        "minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})
    eventually(lambda: env.policy.read_namespaced_pod_disruption_budget("web", env.ns).status.expected_pods == 2,
               "the disruption controller computed the budget")
    with pytest.raises(EvictionError) as raised:
        drain(env.node, env.settings(timeout=3))
    message = str(raised.value)
    assert f"PodDisruptionBudget {env.ns}/web allows 0 disruptions now (needs 2 healthy pods, has 2)" in message
    assert "Already evicted: none" in message and not env.cordoned()
    # One disruption at a time: one pod goes, the Deployment re-creates it on the spare node, then the next goes.
    env.core.patch_node(env.spare, {"spec": {"unschedulable": None}})
    env.policy.patch_namespaced_pod_disruption_budget("web", env.ns, {"spec": {"minAvailable": 1}})
    eventually(lambda: env.policy.read_namespaced_pod_disruption_budget("web", env.ns).status.disruptions_allowed
               == 1, "the budget allows one disruption")
    with ReadyReplicas(env.api, env.ns, "web") as ready:
        result = drain(env.node, env.settings(timeout=60))
    assert len(result["evicted"]) == 2 and not env.on(env.node, "web")
    assert min(ready.seen) >= 1, ready.seen  # never fewer ready replicas than the budget allows


def test_wait_for_completion_holds_evictions_until_matching_pods_finish(env, monkeypatch):
    env.pod("train", labels={"job": "train"})
    serve = env.bound("serve")[0]
    posted = env.count_evictions(monkeypatch)
    threading.Timer(2.0, lambda: env.core.patch_namespaced_pod_status("train", env.ns, {"status": {
        "phase": "Succeeded"}})).start()
    started = time.monotonic()
    result = drain(env.node, env.settings(force=False, wait_for_completion={"pod_selector": "job=train",
                                                                            "timeout": 30}))
    assert time.monotonic() - started >= 2 and posted == [f"{env.ns}/{serve}"]
    assert result["deleted"] == [f"{env.ns}/train"]  # finished, hence no longer a bare pod to refuse


def test_gpu_pods_only_evicts_only_what_uses_a_gpu(env):
    env.core.patch_node_status(env.node, {"status": {"capacity": {"nvidia.com/gpu": "1"},
                                                     "allocatable": {"nvidia.com/gpu": "1"}}})
    train = env.bound("train", containers=[{"name": "c", "image": "img",
                                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}])[0]
    env.pod("notebook")  # bare, but no GPU: left alone, not refused
    result = drain(env.node, env.settings(gpu_pods_only=True))
    assert result["evicted"] == [f"{env.ns}/{train}"]
    assert any(s.startswith(f"{env.ns}/notebook (uses no GPU") for s in result["skipped"])
    assert env.core.read_namespaced_pod("notebook", env.ns).metadata.deletion_timestamp is None


def test_an_admins_cordon_is_left_in_place(env):
    env.core.patch_node(env.node, {"spec": {"unschedulable": True}})
    env.pod("notebook")
    with pytest.raises(EvictionError, match="declares no controller"):
        drain(env.node, env.settings())
    node = env.core.read_node(env.node)
    assert node.spec.unschedulable and CORDON_ANNOTATION not in (node.metadata.annotations or {})


def test_a_node_the_path_switch_holds_cordoned_keeps_that_cordon_when_the_drain_stops(env):
    """E.g. a dra node whose smoke test failed: cordoned by the switch (kube/cordon.py). A refused drain must not
    take that cordon over and undo it."""
    env.core.patch_node(env.node, {"metadata": {"annotations": {CORDON_ANNOTATION: "dra"}},
                                   "spec": {"unschedulable": True}})
    env.pod("notebook")
    with pytest.raises(EvictionError, match="declares no controller"):
        drain(env.node, env.settings())
    node = env.core.read_node(env.node)
    assert node.spec.unschedulable and node.metadata.annotations[CORDON_ANNOTATION] == "dra"


def test_a_pod_its_deleted_daemonset_left_behind_is_refused_then_evicted_with_force(env):
    """Deleting a DaemonSet with propagationPolicy Orphan: the garbage collector removes the pods' ownerReferences
    (kubernetes pkg/controller/garbagecollector, orphanDependents), so the pod declares no controller any more."""
    env.apps.create_namespaced_daemon_set(env.ns, {"metadata": {"name": "old-agent"}, "spec": {
        "selector": {"matchLabels": {"app": "old-agent"}}, "template": {
            "metadata": {"labels": {"app": "old-agent"}}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": env.node}, "containers": [{"name": "c", "image": "img"}]}}}})
    pod = eventually(lambda: [p for p in env.on(env.node, "old-agent") if p.status.phase == "Running"],
                     "DaemonSet pod running")[0].metadata.name
    env.apps.delete_namespaced_daemon_set("old-agent", env.ns, propagation_policy="Orphan")
    eventually(lambda: not env.core.read_namespaced_pod(pod, env.ns).metadata.owner_references,
               "the garbage collector orphaned the pod")
    with pytest.raises(EvictionError, match=rf"{env.ns}/{pod}: declares no controller"):
        drain(env.node, env.settings())
    assert drain(env.node, env.settings(force=True))["evicted"] == [f"{env.ns}/{pod}"]


# What a drain needs (kube/eviction.py, drain_listing.py): nothing more.
DRAINER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},  # cordon, its mark, the record
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get", "delete"]},  # listing, waiting, finished pods
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get"]},
]


def drainer_kubeconfig(env: Env, tmp_path) -> str:
    """A ServiceAccount with only DRAINER_RULES, as a kubeconfig (a bound token from the TokenRequest API)."""
    rbac = client.RbacAuthorizationV1Api(env.api)
    env.core.create_namespaced_service_account(env.ns, {"metadata": {"name": "drainer"}})
    rbac.create_cluster_role({"metadata": {"name": f"drainer-{env.id}"}, "rules": DRAINER_RULES})
    rbac.create_cluster_role_binding({"metadata": {"name": f"drainer-{env.id}"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"drainer-{env.id}"},
        "subjects": [{"kind": "ServiceAccount", "name": "drainer", "namespace": env.ns}]})
    token = env.core.create_namespaced_service_account_token("drainer", env.ns, {
        "spec": {"expirationSeconds": 3600}}).status.token
    cfg = json.loads(open(env.kubeconfig).read())
    cfg["users"] = [{"name": "drainer", "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = "drainer"
    path = tmp_path / "drainer.kubeconfig"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_the_drain_needs_no_more_than_these_permissions(env, tmp_path):
    """The whole drain (cordon, listing, DaemonSet lookup, a budget answer, evictions, a finished pod's delete, the
    wait, the record) as a ServiceAccount holding only DRAINER_RULES: a call outside them would fail with 403."""
    kubeconfig = drainer_kubeconfig(env, tmp_path)
    try:
        web = env.bound("web", 2)
        env.policy.create_namespaced_pod_disruption_budget(env.ns, {"metadata": {"name": "web"}, "spec": {
            "maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}})
        eventually(lambda: env.policy.read_namespaced_pod_disruption_budget("web", env.ns).status.expected_pods == 2,
                   "the disruption controller computed the budget")
        env.apps.create_namespaced_daemon_set(env.ns, {"metadata": {"name": "agent"}, "spec": {
            "selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}},
                                                                       "spec": {
                "nodeSelector": {"kubernetes.io/hostname": env.node}, "containers": [{"name": "c", "image": "i"}]}}}})
        eventually(lambda: env.on(env.node, "agent"), "the DaemonSet's pod")
        settings = {**env.settings(timeout=2), "kubeconfig": kubeconfig}
        with pytest.raises(EvictionError, match=rf"PodDisruptionBudget {env.ns}/web allows 0 disruptions"):
            drain(env.node, settings)  # the budget named through the drainer's own `get`
        env.policy.patch_namespaced_pod_disruption_budget("web", env.ns, {"spec": {"maxUnavailable": 2}})
        eventually(lambda: env.policy.read_namespaced_pod_disruption_budget("web", env.ns).status.disruptions_allowed
                   == 2, "the budget allows the drain")
        result = drain(env.node, {**settings, "timeout": 60})
        assert sorted(result["evicted"]) == sorted(f"{env.ns}/{n}" for n in web)
        assert DRAIN_ANNOTATION in env.core.read_node(env.node).metadata.annotations
    finally:
        rbac = client.RbacAuthorizationV1Api(env.api)
        rbac.delete_cluster_role_binding(f"drainer-{env.id}")
        rbac.delete_cluster_role(f"drainer-{env.id}")
