"""The local cluster shows kwok again a pod it left Pending on a node it plays (gpu_migration_local/kwok_resync.py)."""
from kubernetes import client

from gpu_migration_local.cluster_cache import ClusterCache
from gpu_migration_local.kwok_resync import RESYNC_ANNOTATION, KwokResync, stuck_pods


def pod(uid, node="n1", phase="Pending", deleting=False):
    return client.V1Pod(metadata=client.V1ObjectMeta(uid=uid, name=uid, namespace="ns",
                                                     deletion_timestamp="2026-12-05T00:00:00Z" if deleting else None),
                        spec=client.V1PodSpec(node_name=node, containers=[]), status=client.V1PodStatus(phase=phase))


def test_only_pods_pending_on_a_kwok_node_for_long_enough_are_shown_again():
    since: dict[str, float] = {}
    pods = [pod("a"), pod("running", phase="Running"), pod("other-node", node="real"), pod("unbound", node=None),
            pod("deleting", deleting=True)]
    assert stuck_pods(pods, {"n1"}, since, now=0.0, after=2.0) == []
    assert since == {"a": 0.0}
    assert stuck_pods(pods, {"n1"}, since, now=1.9, after=2.0) == []
    assert [p.metadata.uid for p in stuck_pods(pods, {"n1"}, since, now=2.0, after=2.0)] == ["a"]
    # touched: shown again only `after` seconds later, not on every pass
    assert stuck_pods(pods, {"n1"}, since, now=3.0, after=2.0) == []
    assert [p.metadata.uid for p in stuck_pods(pods, {"n1"}, since, now=4.0, after=2.0)] == ["a"]
    # once Running it is forgotten
    assert stuck_pods([pod("a", phase="Running")], {"n1"}, since, now=9.0, after=2.0) == [] and since == {}


def test_a_stuck_pod_gets_an_update_kwok_sees(kube):
    """On the real API server: the stuck pod's annotation changes (a watch event), a Running one is left alone."""
    fake, plain = kube.name("kwok-node"), kube.name("real-node")
    kube.add_node(fake)  # kube.add_node's nodes are kwok-style
    kube.add_node(plain, annotations={"kwok.x-k8s.io/node": "none"})
    ns = kube.ns("resync")
    kube.add_pod(ns, "stuck", node=fake, phase="Pending")
    kube.add_pod(ns, "other", node=plain, phase="Pending")
    kube.add_pod(ns, "running", node=fake, phase="Running")
    now = [100.0]
    cache = ClusterCache(kube.api).start()  # lists after the pods were added: no watch event to wait for
    try:
        resync = KwokResync(kube.api, cache, clock=lambda: now[0])
        resync.step()
        now[0] += 2.0
        resync.step()
    finally:
        cache.stop()
    annotations = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}) for p in kube.pods(ns)}
    assert RESYNC_ANNOTATION in annotations["stuck"]
    assert RESYNC_ANNOTATION not in annotations["other"] and RESYNC_ANNOTATION not in annotations["running"]
