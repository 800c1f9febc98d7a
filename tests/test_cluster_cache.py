"""The local doubles' cache of Nodes and Pods follows the API server by watch (gpu_migration_local/cluster_cache.py)."""
from gpu_migration_local.cluster_cache import ClusterCache
from tests.envtest import eventually


def names(objects):
    return {o.metadata.name for o in objects}


def test_the_cache_follows_creates_updates_and_deletes_and_wakes_its_subscribers(kube):
    cache = ClusterCache(kube.api).start()
    try:
        woken = cache.subscribe()
        node = kube.name("cached")
        kube.add_node(node)
        eventually(lambda: node in names(cache.nodes()), f"node {node} in the cache")
        assert woken.is_set()
        ns = kube.ns("cache")
        kube.add_pod(ns, "p", node=node, phase="Pending")
        eventually(lambda: "p" in names(p for p in cache.pods() if p.metadata.namespace == ns), "pod p in the cache")
        kube.core.patch_node(node, {"metadata": {"labels": {"seen": "yes"}}})
        eventually(lambda: any(n.metadata.labels.get("seen") == "yes" for n in cache.nodes()
                               if n.metadata.name == node), "the node's new label in the cache")
        woken.clear()
        kube.delete_pod(ns, "p")
        kube.delete_node(node)
        eventually(lambda: node not in names(cache.nodes()), f"node {node} gone from the cache")
        assert woken.is_set() and "p" not in names(p for p in cache.pods() if p.metadata.namespace == ns)
    finally:
        cache.stop()


def test_a_watch_too_old_to_resume_lists_again(kube, monkeypatch):
    """410 Gone (the resourceVersion was compacted away): the cache lists again, as client-go's reflector does."""
    from kubernetes import client, watch

    node_watches = []
    real_stream = watch.Watch.stream

    def stream(self, func, *args, **kwargs):
        if func.__name__ == "list_node":
            node_watches.append(kwargs.get("resource_version"))
            if len(node_watches) == 1:
                raise client.ApiException(status=410, reason="Expired")
        return real_stream(self, func, *args, **kwargs)

    monkeypatch.setattr(watch.Watch, "stream", stream)
    lists = []
    real_list = ClusterCache._list
    monkeypatch.setattr(ClusterCache, "_list", lambda self, kind: lists.append(kind) or real_list(self, kind))
    cache = ClusterCache(kube.api).start()
    try:
        node = kube.name("relisted")
        eventually(lambda: lists.count("nodes") == 2, "a second list of nodes after 410 Gone")
        kube.add_node(node)
        eventually(lambda: node in names(cache.nodes()), f"node {node} in the cache after the relist")
        assert cache.errors == []
    finally:
        cache.stop()


def test_a_bookmark_moves_the_watch_on_without_an_error(kube, monkeypatch):
    """The API server's bookmarks (about once a minute) carry only a resourceVersion, which the client leaves as JSON:
    the next watch starts from it."""
    from kubernetes import watch

    resumed = []
    real_stream = watch.Watch.stream

    def stream(self, func, *args, **kwargs):
        if func.__name__ != "list_node":
            return real_stream(self, func, *args, **kwargs)
        resumed.append(kwargs["resource_version"])
        if len(resumed) == 1:
            return iter([{"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "1"}},
                          "raw_object": {}}])
        return real_stream(self, func, *args, **kwargs)

    monkeypatch.setattr(watch.Watch, "stream", stream)
    cache = ClusterCache(kube.api).start()
    try:
        eventually(lambda: len(resumed) >= 2, "a second watch")
        assert resumed[1] == "1" and cache.errors == []
    finally:
        cache.stop()
