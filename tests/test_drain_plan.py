"""The drain's decisions (plan/drain.py), without a cluster: kubectl drain's filters and the Eviction API's answers."""
from iks_gpu_migration.plan.drain import DrainOptions, PodView, namespace_terminating, pods_for_deletion, too_many

RS = ("ReplicaSet", "web-7d9")


def actions(pods, daemonsets=frozenset(), **opts):
    listed = pods_for_deletion(pods, set(daemonsets), DrainOptions(**opts))
    return ({v.pod.name: v.action for v in listed.verdicts + listed.refused}, listed)


def test_a_bare_pod_and_an_emptydir_pod_refuse_the_whole_drain_naming_both_and_the_opt_ins():
    pods = [PodView("ml", "web", controller=RS), PodView("ml", "notebook"),
            PodView("ml", "cache", controller=RS, empty_dirs=("scratch",))]
    got, listed = actions(pods)
    assert got == {"web": "evict", "notebook": "refuse", "cache": "refuse"}
    message = listed.refusal("n1")
    assert "ml/notebook: declares no controller" in message and "drain.force: true" in message
    assert "ml/cache: emptyDir volume scratch would lose its data" in message
    assert "drain.deleteEmptyDirData: true" in message and "Nothing was evicted" in message


def test_the_opt_ins_let_them_go():
    pods = [PodView("ml", "notebook"), PodView("ml", "cache", controller=RS, empty_dirs=("scratch",))]
    assert actions(pods, force=True, delete_empty_dir_data=True)[0] == {"notebook": "evict", "cache": "evict"}
    # Each opt-in covers only its own kind of loss.
    assert actions(pods, force=True)[0]["cache"] == "refuse"
    assert actions(pods, delete_empty_dir_data=True)[0]["notebook"] == "refuse"


def test_daemonset_pods_are_skipped_only_while_their_daemonset_exists():
    pods = [PodView("op", "plugin-a", controller=("DaemonSet", "plugin"), controller_api="apps/v1"),
            PodView("op", "old-b", controller=("DaemonSet", "removed"), controller_api="apps/v1")]
    got, listed = actions(pods, {("op", "plugin")})
    assert got == {"plugin-a": "skip", "old-b": "refuse"}
    assert "no apps/v1 DaemonSet removed exists, so nothing known re-creates it" in listed.refusal("n1")
    assert actions(pods, {("op", "plugin")}, force=True)[0]["old-b"] == "evict"
    # A DaemonSet of the same name in another namespace is not its controller.
    assert actions(pods[:1], {("other", "plugin")})[0]["plugin-a"] == "refuse"


def test_another_api_groups_daemonset_is_looked_up_as_kubectl_does():
    """Issue 37 §3: kubectl's daemonSetFilter (k8s.io/kubectl pkg/drain/filters.go) checks the controller's Kind only
    and then gets the apps/v1 DaemonSet of that name: an OpenKruise DaemonSet's pod is skipped when one of its name
    exists, refused otherwise (kubectl fails on it), evicted with force; never evicted like a ReplicaSet's."""
    kruise = PodView("op", "agent", controller=("DaemonSet", "agent"), controller_api="apps.kruise.io/v1alpha1")
    got, listed = actions([kruise])
    assert got == {"agent": "refuse"}
    assert "no apps/v1 DaemonSet agent exists (its controller is apps.kruise.io/v1alpha1" in listed.refusal("n1")
    assert actions([kruise], {("op", "agent")})[0] == {"agent": "skip"}
    assert actions([kruise], force=True)[0] == {"agent": "evict"}


def test_mirror_pods_are_skipped_finished_pods_deleted_terminating_pods_awaited_not_evicted_again():
    pods = [PodView("kube-system", "static", mirror=True), PodView("kube-system", "static-done", mirror=True,
                                                                   phase="Succeeded"),
            PodView("ml", "job-done", phase="Succeeded"),
            PodView("ml", "failed", phase="Failed", empty_dirs=("x",)),
            PodView("ml", "leaving", controller=RS, terminating_for=3)]
    assert actions(pods)[0] == {"static": "skip", "static-done": "skip", "job-done": "delete", "failed": "delete",
                                "leaving": "await"}


def test_a_pod_terminating_longer_than_skip_wait_for_delete_timeout_is_skipped():
    pods = [PodView("ml", "stuck", controller=RS, terminating_for=120),
            PodView("ml", "fresh", controller=RS, terminating_for=10)]
    assert actions(pods, skip_wait_for_delete_timeout=60)[0] == {"stuck": "skip", "fresh": "await"}
    assert actions(pods)[0] == {"stuck": "await", "fresh": "await"}  # 0: wait for each (kubectl's default)


def test_gpu_pods_only_leaves_every_other_pod_alone_even_a_bare_one():
    pods = [PodView("ml", "train", controller=RS, uses_gpu=True), PodView("ml", "sidecar"),
            PodView("ml", "bare-gpu", uses_gpu=True)]
    got, _ = actions(pods, gpu_pods_only=True)
    assert got == {"train": "evict", "sidecar": "skip", "bare-gpu": "refuse"}


def test_a_429_names_the_budget_or_says_throttling_and_keeps_retry_after():
    # As kubernetes pkg/registry/core/pod/storage/eviction.go (checkAndDecrement) answers; causes carry "reason".
    budget = {"message": "Cannot evict pod as it would violate the pod's disruption budget.", "details": {
        "causes": [{"reason": "DisruptionBudget",
                    "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}}
    answer = too_many(budget, None)
    assert answer.budget == "web" and "needs 2 healthy pods" in answer.message and answer.retry_after == 0
    processing = {"details": {"retryAfterSeconds": 10, "causes": [
        {"reason": "DisruptionBudget", "message": "The disruption budget web is still being processed by the server."}]}}
    assert too_many(processing, None).budget == "web" and too_many(processing, None).retry_after == 10
    throttled = {"message": "Too many requests, please try again later.", "details": {"retryAfterSeconds": 1}}
    answer = too_many(throttled, "7")
    assert answer.budget is None and answer.retry_after == 7  # the header wins
    assert too_many({}, "Wed, 21 Oct 2026 07:28:00 GMT").retry_after == 0


def test_a_403_is_retried_only_for_a_terminating_namespace():
    assert namespace_terminating({"details": {"causes": [{"reason": "NamespaceTerminating"}]}})
    assert not namespace_terminating({"details": {"causes": [{"reason": "FieldValueForbidden"}]}})
    assert not namespace_terminating({})
