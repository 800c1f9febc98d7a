"""Issue 18 point 1, Kubernetes: the shipped roles (iks_gpu_migration/rbac/) against the real API server of the fast
tests, which enforces RBAC (tests/envtest.py): they name only resources and verbs the server serves, `up`'s preflight
names every rule an identity lacks, and a request refused mid-run stops with Kubernetes' own message (user, verb,
resource) instead of a bare 403."""
import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from iks_gpu_migration.kube import permissions
from iks_gpu_migration.kube.fence import _NodeFenceProvider
from iks_gpu_migration.kube.provider import _short
from iks_gpu_migration.kube.refusals import PermissionDenied, explained, refusal
from tests.real.identities import RBAC
from tests.test_iks_providers import replace
from tests.test_node_eviction import env  # noqa: F401 - the fixture: IKS worker w1 and its node on the API server

SERVED = {"": client.CoreV1Api, "apps": client.AppsV1Api, "policy": client.PolicyV1Api,
          "resource.k8s.io": client.ResourceV1Api}


def role(name: str, rules_of: str = "ClusterRole") -> dict:
    docs = yaml.safe_load_all((RBAC / f"{name}.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == rules_of)


def without(rules: list[dict], resource: str, verb: str) -> list[dict]:
    """The rules less `verb` on `resource` (a rule left without verbs goes: the API server refuses it)."""
    edited = [{**r, "verbs": [v for v in r["verbs"] if not (resource in r["resources"] and v == verb)]} for r in rules]
    return [r for r in edited if r["verbs"]]


def forbidden(message: str, status: int = 403) -> ApiException:
    e = ApiException(status=status, reason="Forbidden")
    e.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "reason": "Forbidden",
                         "code": status})
    return e


@pytest.mark.parametrize("name", ["gpu-migration", "gpu-migration-status"])
def test_every_rule_names_a_resource_and_verbs_the_api_server_serves(kube, name):
    """A typo in a manifest (`node`, `evict`) would grant nothing and fail only in production."""
    docs = [role(name)] + ([role(name, "Role")] if name == "gpu-migration" else [])
    for doc in docs:
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                served = {r.name: set(r.verbs) for r in SERVED[group](kube.api).get_api_resources().resources}
                for resource in rule["resources"]:
                    assert resource in served, (name, group, resource)
                    assert set(rule["verbs"]) <= served[resource], (name, resource, rule["verbs"], served[resource])


def test_the_preflight_checks_every_verb_and_resource_of_the_shipped_role():
    rules = permissions.shipped_rules()
    assert rules == role("gpu-migration")["rules"]
    found = permissions.checks(rules)
    assert permissions.Check("", "pods/eviction", "create") in found
    assert len(found) == sum(len(r["resources"]) * len(r["verbs"]) * len(r["apiGroups"]) for r in rules)


def test_the_preflight_passes_the_shipped_role_and_names_each_rule_an_identity_lacks(kube):
    from kubernetes import config
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
