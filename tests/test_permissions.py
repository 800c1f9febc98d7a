"""Issue 18 point 1 and issue 37 section 1, Kubernetes: the shipped roles (iks_gpu_migration/rbac/) against the real
API server of the fast tests, which enforces RBAC (tests/envtest.py): they name only resources and verbs the server
serves and grant the watches the waits use; `up`'s preflight names every rule an identity lacks, in the namespace
and for the object the program names (the smoke namespace's Role, the program's own DeviceClass), and the chart
identity's; a refused watch is said once; a request refused mid-run stops with Kubernetes' own message (user, verb,
resource) instead of a bare 403."""
import json
import threading
import time

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from iks_gpu_migration.kube import clients, node_changes, permissions
from iks_gpu_migration.kube.fence import _NodeFenceProvider
from iks_gpu_migration.kube.provider import _short
from iks_gpu_migration.kube.refusals import PermissionDenied, explained, refusal, status_message
from tests.envtest import eventually
from tests.real.identities import RBAC
from tests.test_iks_providers import replace
from tests.test_node_eviction import env  # noqa: F401 - the fixture: IKS worker w1 and its node on the API server

SERVED = {"": client.CoreV1Api, "apps": client.AppsV1Api, "policy": client.PolicyV1Api,
          "resource.k8s.io": client.ResourceV1Api, "coordination.k8s.io": client.CoordinationV1Api}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((RBAC / f"{name}.yaml").read_text()) if d]


def role(name: str, rules_of: str = "ClusterRole", role_name: str = "") -> dict:
    """The first ClusterRole (or Role) of rbac/<name>.yaml, or the one named `role_name`."""
    return next(d for d in docs(name) if d["kind"] == rules_of and role_name in ("", d["metadata"]["name"]))


def without(rules: list[dict], resource: str, verb: str) -> list[dict]:
    """The rules less `verb` on `resource` (a rule left without verbs goes: the API server refuses it)."""
    edited = [{**r, "verbs": [v for v in r["verbs"] if not (resource in r["resources"] and v == verb)]} for r in rules]
    return [r for r in edited if r["verbs"]]


def named(rules: list[dict], resource: str, names: list[str]) -> list[dict]:
    """The rules with `resource`'s resourceNames set to `names` (a test's own objects)."""
    return [{**r, "resourceNames": names} if r.get("resourceNames") and resource in r["resources"] else r
            for r in rules]


def forbidden(message: str, status: int = 403) -> ApiException:
    e = ApiException(status=status, reason="Forbidden")
    e.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "reason": "Forbidden",
                         "code": status})
    return e


def smoke_role(kube, base: str, namespace: str, rules: list[dict]) -> None:
    """The Role gpu-migration-smoke (`rules`) in `namespace`, bound to the identity `base` (Kube.identity's)."""
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": permissions.SMOKE_ROLE}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {"metadata": {"name": permissions.SMOKE_ROLE}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": permissions.SMOKE_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": base, "namespace": kube.ns("identities")}]})


def refused_with(call) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value
    return status_message(refused.value)


@pytest.mark.parametrize("name", ["gpu-migration", "gpu-migration-status"])
def test_every_rule_names_a_resource_and_verbs_the_api_server_serves(kube, name):
    """A typo in a manifest (`node`, `evict`) would grant nothing and fail only in production."""
    roles = [d for d in docs(name) if d["kind"] in ("ClusterRole", "Role")]
    assert len(roles) == (4 if name == "gpu-migration" else 1)
    for doc in roles:
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                served = {r.name: set(r.verbs) for r in SERVED[group](kube.api).get_api_resources().resources}
                for resource in rule["resources"]:
                    assert resource in served, (name, group, resource)
                    assert set(rule["verbs"]) <= served[resource], (name, resource, rule["verbs"], served[resource])


def test_the_preflight_checks_every_verb_and_resource_of_the_shipped_roles():
    rules = permissions.shipped_rules()
    assert rules == role("gpu-migration")["rules"]
    found = permissions.checks(rules)
    assert permissions.Check("", "pods/eviction", "create") in found
    assert len(found) == sum(len(r["resources"]) * len(r["verbs"]) * len(r["apiGroups"])
                             * len(r.get("resourceNames") or [""]) for r in rules)
    # The program's own DeviceClass, by the name the program gives it; the smoke Role's rules in its namespace.
    assert permissions.Check("resource.k8s.io", "deviceclasses", "delete", name="example.com-gpu") in \
        permissions.checks(rules, names={"deviceclasses": ["example.com-gpu"]})
    smoke = permissions.checks(permissions.shipped_rules(kind="Role", name=permissions.SMOKE_ROLE), "ns1")
    assert permissions.Check("", "pods", "create", "ns1") in smoke and all(c.namespace == "ns1" for c in smoke)
    charts = permissions.chart_checks()
    assert permissions.Check("rbac.authorization.k8s.io", "clusterroles", "escalate") in charts
    assert permissions.Check("rbac.authorization.k8s.io", "clusterrolebindings", "bind") in charts


def test_the_program_role_writes_pods_and_namespaces_only_where_it_needs_to():
    """No cluster-wide pod create or patch (a pod in any namespace can run as any ServiceAccount there), no
    cluster-wide namespace patch or delete, DeviceClass patch and delete only of the program's own."""
    cluster = {(g, res, v) for r in role("gpu-migration")["rules"] if not r.get("resourceNames")
               for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    assert not {("", "pods", "create"), ("", "pods", "patch"), ("", "namespaces", "patch"),
                ("", "namespaces", "delete"), ("resource.k8s.io", "deviceclasses", "patch"),
                ("resource.k8s.io", "deviceclasses", "delete")} & cluster
    # The watches of kube/node_changes.py.
    assert {("", "nodes", "watch"), ("", "pods", "watch"), ("resource.k8s.io", "resourceslices", "watch")} <= cluster
    smoke = role("gpu-migration", "Role", permissions.SMOKE_ROLE)
    assert smoke["metadata"]["namespace"] == "gpu-pilot"  # SmokeTest.namespace's default
    assert next(d for d in docs("gpu-migration") if d["kind"] == "Namespace")["metadata"]["name"] == "gpu-pilot"


def test_the_preflight_passes_the_shipped_role_and_names_each_rule_an_identity_lacks(kube):
    shipped = role("gpu-migration")["rules"]
    with config.new_client_from_config(kube.identity("full", shipped)) as api:
        permissions.require(api)  # nothing missing
    lacking = without(without(shipped, "pods/eviction", "create"), "deviceclasses", "create")
    with config.new_client_from_config(kube.identity("lacking", lacking)) as api:
        with pytest.raises(PermissionDenied) as stopped:
            permissions.require(api)
    message = str(stopped.value)
    ns = kube.name("identities")
    assert f"(User 'system:serviceaccount:{ns}:lacking') lacks permissions the program needs; nothing was " \
           f"changed:" in message, message
    assert message.count("\n  - ") == 2, message
    assert '- cannot create resource "pods/eviction" in API group "" at the cluster scope' in message
    assert '- cannot create resource "deviceclasses" in API group "resource.k8s.io" at the cluster scope' in message
    assert "ClusterRole gpu-migration" in message and "rbac/gpu-migration.yaml" in message


def test_an_identity_with_the_narrowed_roles_passes_and_writes_pods_only_in_the_smoke_namespace(kube):
    """The shipped ClusterRole and the smoke namespace's Role: the preflight asks in that namespace and for the
    program's DeviceClass by name, and passes; the identity really can't create pods or delete a namespace or a
    DeviceClass elsewhere, so a check at the cluster scope (before issue 37) would have refused it."""
    smoke, other, own = kube.ns("gpu-pilot"), kube.ns("ml"), kube.name("own-gpu")
    kube.add_device_class(own, None)
    kube.add_device_class(kube.name("chart-gpu"), None)
    kubeconfig = kube.identity("narrow", named(role("gpu-migration")["rules"], "deviceclasses", [own]))
    smoke_role(kube, "narrow", smoke, role("gpu-migration", "Role", permissions.SMOKE_ROLE)["rules"])
    scope = {"smoke_namespace": smoke, "smoke_pods": True, "device_class": own}
    pod = {"metadata": {"name": "check"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    with config.new_client_from_config(kubeconfig) as api:
        permissions.require(api, scope=scope)
        assert permissions.missing(api, [permissions.Check("", "pods", "create"),
                                         permissions.Check("", "namespaces", "delete")]) != []
        core, dra = client.CoreV1Api(api), client.ResourceV1Api(api)
        core.create_namespaced_pod(smoke, pod)
        core.delete_namespace(smoke, dry_run="All")  # the smoke namespace itself, through the Role in it
        dra.delete_device_class(own, dry_run="All")
        user = f'User "system:serviceaccount:{kube.name("identities")}:narrow"'
        assert f'{user} cannot create resource "pods" in API group "" in the namespace "{other}"' in \
            refused_with(lambda: core.create_namespaced_pod(other, pod))
        assert f'{user} cannot delete resource "namespaces"' in refused_with(
            lambda: core.delete_namespace(other, dry_run="All"))
        assert f'{user} cannot delete resource "deviceclasses"' in refused_with(
            lambda: dra.delete_device_class(kube.name("chart-gpu"), dry_run="All"))


def test_the_smoke_role_is_required_while_a_node_is_dra_or_its_namespace_exists(kube):
    """Without the Role: no need while the namespace is gone and no node is dra (`up` deleted it, and the Role with
    it); a dra node, or the namespace back, and the preflight names what the Role grants and how to get it back."""
    with config.new_client_from_config(kube.identity("no-smoke", role("gpu-migration")["rules"])) as api:
        permissions.require(api, scope={"smoke_namespace": kube.name("gone"), "smoke_pods": False})
        for scope in ({"smoke_namespace": kube.name("gone"), "smoke_pods": True},
                      {"smoke_namespace": kube.ns("there"), "smoke_pods": False}):
            with pytest.raises(PermissionDenied) as stopped:
                permissions.require(api, scope=scope)
            message, ns = str(stopped.value), scope["smoke_namespace"]
            assert f'- cannot create resource "pods" in API group "" in the namespace "{ns}"' in message, message
            assert f'- cannot delete resource "namespaces" in API group "" in the namespace "{ns}"' in message
            # pods create, patch; namespaces patch, delete (pods delete: the ClusterRole's, for the drain)
            assert message.count("\n  - ") == 4, message
            assert f"the Role {permissions.SMOKE_ROLE} of the same file" in message
            assert "apply the file again before a node is dra again" in message


def test_the_device_class_rule_is_checked_for_the_program_s_own_class(kube):
    with config.new_client_from_config(kube.identity("classes", role("gpu-migration")["rules"])) as api:
        permissions.require(api, scope={"device_class": "nvidia.com-gpu"})  # the shipped name
        with pytest.raises(PermissionDenied) as stopped:
            permissions.require(api, scope={"device_class": "example.com-gpu"})
    assert ('- cannot delete resource "deviceclasses" in API group "resource.k8s.io" at the cluster scope (the '
            'object "example.com-gpu")') in str(stopped.value)
    assert str(stopped.value).count("\n  - ") == 2  # patch and delete


def test_the_chart_identity_is_checked_before_anything_changes(kube):
    """Its own kubeconfig (chartKubeconfig), or the program's when unset: every rule of gpu-migration-charts, the
    escalate and bind the GPU Operator's ClusterRole needs included."""
    program = kube.identity("program", role("gpu-migration")["rules"])
    charts = role("gpu-migration-charts")["rules"]
    with config.new_client_from_config(program) as api:
        permissions.require(api, scope={"charts": True, "chart_kubeconfig": kube.identity("charts", charts)})
        with pytest.raises(PermissionDenied) as lacking:
            permissions.require(api, scope={"charts": True, "chart_kubeconfig": kube.identity(
                "no-escalate", without(charts, "clusterroles", "escalate"))})
        with pytest.raises(PermissionDenied) as unset:
            permissions.require(api, scope={"charts": True, "chart_kubeconfig": ""})
    message, ns = str(lacking.value), kube.name("identities")
    assert (f"the identity of gpu-migration:chartKubeconfig (User 'system:serviceaccount:{ns}:no-escalate') lacks "
            "permissions the Helm releases of the GPU Operator and the DRA driver need; nothing was changed:") \
        in message
    assert '- cannot escalate resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster ' \
           'scope' in message
    assert message.count("\n  - ") == 4, message  # escalate on the rule's four kinds
    assert "ClusterRole gpu-migration-charts" in message and "lacks permissions the program needs" not in message
    assert ("the identity of gpu-migration:kubeconfig (which installs the charts while gpu-migration:chartKubeconfig "
            "is unset)") in str(unset.value)
    assert '- cannot bind resource "clusterroles"' in str(unset.value)


@pytest.fixture
def fresh_watches(monkeypatch):
    monkeypatch.setattr(node_changes, "WATCH_SECONDS", 1)
    monkeypatch.setattr(node_changes, "WATCHES", node_changes._Watches())
    monkeypatch.setattr(node_changes, "_REFUSED", set())
    monkeypatch.setattr(clients, "_CLIENTS", clients._Clients())
    warnings: list[str] = []
    monkeypatch.setattr(node_changes.pulumi.log, "warn", lambda message, *a, **k: warnings.append(message))
    return warnings


def woke(sleep, change) -> bool:
    """Whether `change()`, 0.3 s into a 10 s sleep, ended it (within 3 s)."""
    sleep(0.3)  # an earlier wake is spent
    timer = threading.Timer(0.3, change)
    started = time.monotonic()
    timer.start()
    sleep(10)
    timer.join()
    return time.monotonic() - started < 3


def test_the_shipped_role_lets_the_waits_watch_nodes_pods_and_slices(kube, fresh_watches):
    node = kube.name("n1")
    kube.add_node(node)
    kubeconfig = kube.identity("watcher", role("gpu-migration")["rules"])
    with node_changes.woken_by_changes(kubeconfig, node, slices=True) as sleep:
        time.sleep(0.5)  # the watches are up
        assert woke(sleep, lambda: kube.patch_node(node, {"metadata": {"labels": {"a": "1"}}}))
        assert woke(sleep, lambda: kube.add_slice(node, "gpu.nvidia.com", {"gpu-0": "GPU-1"}))
        assert woke(sleep, lambda: kube.add_pod(kube.ns("gpu-operator"), "driver", node=node))
    assert fresh_watches == []


def test_a_refused_watch_is_said_once_and_not_asked_again(kube, fresh_watches, monkeypatch):
    node = kube.name("n1")
    kube.add_node(node)
    kubeconfig = kube.identity("no-watch", without(role("gpu-migration")["rules"], "nodes", "watch"))
    requests = kube.record(monkeypatch)
    for _ in range(2):  # two waits, one after the other
        with node_changes.woken_by_changes(kubeconfig, node):
            eventually(lambda: fresh_watches, "the refusal said", timeout=10)
            time.sleep(2.5)  # a retry would come 1 s, then 2 s after the refusal
    node_watches = [r for r in requests if r[1].startswith("/api/v1/nodes?") and "watch=true" in r[1].lower()]
    assert len(node_watches) == 1, node_watches
    assert len(fresh_watches) == 1, fresh_watches
    assert fresh_watches[0].startswith("watching nodes was refused (") and 'cannot watch resource "nodes"' in \
        fresh_watches[0] and "grant list and watch on nodes (gpu-migration.yaml, ClusterRole gpu-migration)" in \
        fresh_watches[0], fresh_watches


def test_a_request_refused_mid_run_names_user_verb_and_resource(kube):
    """The fence's label patch refused by RBAC: the error is Kubernetes' own sentence, not `HTTP 403 Forbidden` or
    a traceback of response headers."""
    node = kube.name("10.240.0.31")
    kube.add_node(node, kubelet_version="v1.35.4+IKS")
    kubeconfig = kube.identity("fence", without(role("gpu-migration")["rules"], "nodes", "patch"))
    props = {"kubeconfig": kubeconfig, "node": node, "labels": {"nvidia.com/gpu.deploy.operands": "false"},
             "operator_min_version": "1.36", "stage": "ibm-managed"}
    with pytest.raises(PermissionDenied) as refused:
        _NodeFenceProvider().create(props)
    user = f"system:serviceaccount:{kube.name('identities')}:fence"
    assert (f'nodes "{node}" is forbidden: User "{user}" cannot patch resource "nodes" in API group "" at the '
            f'cluster scope') in str(refused.value), refused.value
    assert "ClusterRole gpu-migration" in str(refused.value)
    assert "nvidia.com/gpu.deploy.operands" not in kube.labels(node)


def test_a_drain_refused_before_the_replacement_names_the_refusal_and_replaces_nothing(env, kube):  # noqa: F811
    iks_emu, _, settings, _, node = env
    kubeconfig = kube.identity("drainer", without(role("gpu-migration")["rules"], "nodes", "patch"))
    with pytest.raises(PermissionDenied, match=r'cannot patch resource "nodes" in API group "" at the cluster scope'):
        replace(iks_emu, "w1", evict={**settings, "kubeconfig": kubeconfig})
    assert iks_emu.count("POST", "/v2/vpc/replaceWorker") == 0 and not kube.unschedulable(node)


def test_only_rbac_refusals_are_turned_into_permission_errors():
    rbac = forbidden('pods "p" is forbidden: User "u" cannot create resource "pods" in API group "" in the '
                     'namespace "ml"')
    terminating = forbidden('pods "p" is forbidden: unable to create new content in namespace ml because it is '
                            'being terminated')
    assert refusal(rbac).startswith('pods "p" is forbidden: User "u" cannot create')
    assert refusal(terminating) is None and refusal(forbidden("x cannot y", 404)) is None
    with pytest.raises(ApiException):
        with explained():
            raise terminating
    with pytest.raises(PermissionDenied, match='User "u" cannot create resource "pods"'):
        with explained():
            raise rbac


def test_short_errors_keep_kubernetes_message():
    assert _short(forbidden('nodes "n" is forbidden: User "u" cannot patch resource "nodes"')) == \
        'HTTP 403 Forbidden: nodes "n" is forbidden: User "u" cannot patch resource "nodes"'
    assert _short(ApiException(status=500, reason="Internal Server Error")) == "HTTP 500 Internal Server Error"


def test_an_eviction_refused_by_rbac_names_it_and_the_role(kube):
    from iks_gpu_migration.kube.eviction import EvictionError, drain
    from tests.test_node_eviction import running
    node = kube.name("10.240.0.32")
    kube.add_node(node)
    running(kube, "web", node)
    kubeconfig = kube.identity("evictor", without(role("gpu-migration")["rules"], "pods/eviction", "create"))
    with pytest.raises(EvictionError) as refused:
        drain(node, {"kubeconfig": kubeconfig, "timeout": 5, "poll_interval": 0.01})
    message = str(refused.value)
    user = f"system:serviceaccount:{kube.name('identities')}:evictor"
    assert f'User "{user}" cannot create resource "pods/eviction" in API group ""' in message, message
    assert ("may not evict pods: bind the identity of gpu-migration:kubeconfig to the ClusterRole gpu-migration"
            in message)
    assert not kube.unschedulable(node)  # the drain's cordon undone
