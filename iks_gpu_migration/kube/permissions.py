"""The preflight of the program's Kubernetes permissions: every verb and resource of the shipped roles
(iks_gpu_migration/rbac/) checked before anything changes, each missing one named, for both identities: the
program's (gpu-migration:kubeconfig: the ClusterRole gpu-migration, the Role gpu-migration-smoke in the smoke tests'
namespace, with a shared budget the Role of its Lease) and the charts' (gpu-migration:chartKubeconfig, else the same
kubeconfig: the ClusterRole gpu-migration-charts), so a chart install that Kubernetes would refuse stops `up` before
the master update and the fences, not after them.

It asks the API server itself, one SelfSubjectAccessReview per verb and resource (what `kubectl auth can-i` does), in
the namespace the program sends the request to and for the object a rule is limited to (resourceNames): its answer
is the authorizer's decision, which a SelfSubjectRulesReview's is not ("may be incomplete depending on the server's
authorization mode ... should NOT Be used by external systems to drive authorization decisions", k8s.io/api
authorization/v1 types.go). Every authenticated user may create both (the system:basic-user ClusterRole, kubernetes
plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go).
"""
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any, Optional

import pulumi
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .clients import api_client
from .provider import _bullets, _short
from .refusals import KUBECONFIG_KEY, ROLE_FILE, ROLE_NAME, PermissionDenied, fix, role_text

SHARED_BUDGET_ROLE = "gpu-migration-shared-budget"
SMOKE_ROLE = "gpu-migration-smoke"
CHARTS_FILE, CHARTS_ROLE = "gpu-migration-charts.yaml", "gpu-migration-charts"
CHART_KUBECONFIG_KEY = "gpu-migration:chartKubeconfig"
WORKERS = 16  # reviews at once: about 220 for both identities, each a small request the API server answers alone


@dataclass(frozen=True)
class Check:
    group: str
    resource: str  # "pods" or "pods/eviction"
    verb: str
    namespace: str = ""  # a Role's rule (in this namespace); "" a ClusterRole's, cluster-wide
    name: str = ""  # the object, for a rule limited to resourceNames

    def describe(self) -> str:
        """As the API server words a refusal."""
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        named = f' (the object "{self.name}")' if self.name else ""
        return f'cannot {self.verb} resource "{self.resource}" in API group "{self.group}" {scope}{named}'


def shared_budget_checks(namespace: str) -> list[Check]:
    """The Role gpu-migration-shared-budget of rbac/gpu-migration.yaml (kube/shared_budget.py's requests)."""
    return [Check("coordination.k8s.io", "leases", verb, namespace) for verb in ("get", "create", "update")]


def shipped_rules(text: Optional[str] = None, kind: str = "ClusterRole", name: str = ROLE_NAME) -> list[dict[str, Any]]:
    """The rules of role `name` (of `kind`) in the shipped manifest gpu-migration.yaml (or in `text`)."""
    for doc in yaml.safe_load_all(role_text() if text is None else text):
        if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
            return doc["rules"]
    raise ValueError(f"no {kind} {name} in {ROLE_FILE}")


def charts_text() -> str:
    return (resources.files("iks_gpu_migration") / "rbac" / CHARTS_FILE).read_text()


def checks(rules: list[dict[str, Any]], namespace: str = "",
           names: Optional[dict[str, list[str]]] = None) -> list[Check]:
    """One check per group, resource and verb of the rules (pure). A rule limited to resourceNames is checked for the
    objects the program uses (`names`: resource -> names; the rule's own if it gives none): an edited name in the
    role then fails here, not in the middle of a run."""
    out = []
    for rule in rules:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule["resources"]:
                objects = ((names or {}).get(resource) or rule["resourceNames"]) if rule.get("resourceNames") else [""]
                out += [Check(group, resource, verb, namespace, name) for name in objects for verb in rule["verbs"]]
    return out


def _allowed(api, check: Check) -> bool:
    resource, _, subresource = check.resource.partition("/")
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(group=check.group, resource=resource,
                                                        subresource=subresource or None, verb=check.verb,
                                                        namespace=check.namespace or None, name=check.name or None)))
    return bool(client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed)


def whoami(api) -> str:
    """The user the API server sees (a SelfSubjectReview, as `kubectl auth whoami`); '' if it can't be told."""
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
        return (review.status.user_info.username or "") if review.status and review.status.user_info else ""
    except Exception:  # noqa: BLE001 - it only adds the name to the message
        return ""


def missing(api, wanted: Optional[list[Check]] = None) -> list[Check]:
    """The checks the kubeconfig's identity fails (by default every one of the shipped ClusterRole)."""
    wanted = checks(shipped_rules()) if wanted is None else wanted
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        allowed = list(pool.map(lambda c: _allowed(api, c), wanted))
    return [c for c, ok in zip(wanted, allowed) if not ok]


def _exists(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        if e.status == 403:  # may not read it: the ClusterRole's check names that; the Role is checked too
            return True
        raise
    return True


def program_checks(api, shared_budget_namespace: Optional[str], scope: dict[str, Any]) -> list[Check]:
    """What gpu-migration:kubeconfig needs: the ClusterRole (its own DeviceClass by name), the Lease's Role with a
    shared budget, and the smoke namespace's Role while the program uses that namespace: a node is dra, or the
    namespace is there (a rollback's check pod runs in it). `up` deletes it once no node is dra, and the Role with it:
    no later `up` needs the Role until a node is dra again."""
    names = {"deviceclasses": [scope["device_class"]]} if scope.get("device_class") else None
    wanted = checks(shipped_rules(), names=names)
    if shared_budget_namespace:
        wanted += shared_budget_checks(shared_budget_namespace)
    smoke = scope.get("smoke_namespace")
    if smoke and (scope.get("smoke_pods") or _exists(client.CoreV1Api(api), smoke)):
        wanted += checks(shipped_rules(kind="Role", name=SMOKE_ROLE), namespace=smoke)
    return wanted


def chart_checks() -> list[Check]:
    """What the chart identity needs: every rule of the ClusterRole gpu-migration-charts."""
    return checks(shipped_rules(charts_text(), name=CHARTS_ROLE))


def _program_fix(lacking: list[Check], shared_budget_namespace: Optional[str], scope: dict[str, Any]) -> str:
    text = fix()
    if shared_budget_namespace and any(c.namespace == shared_budget_namespace for c in lacking):
        text += (f" (the leases: the Role {SHARED_BUDGET_ROLE} of the same file, in namespace "
                 f"{shared_budget_namespace})")
    smoke = scope.get("smoke_namespace")
    if smoke and any(c.namespace == smoke for c in lacking):
        text += (f" (pods and the namespace {smoke}: the Role {SMOKE_ROLE} of the same file, in the namespace "
                 f"of gpu-migration:smokeTest.namespace; `up` deletes that namespace, and the Role in it, once no "
                 f"node is dra: apply the file again before a node is dra again)")
    return text


def _charts_part(api, lacking: list[Check], separate: bool) -> str:
    user = whoami(api)
    who = CHART_KUBECONFIG_KEY if separate else f"{KUBECONFIG_KEY} (which installs the charts while " \
        f"{CHART_KUBECONFIG_KEY} is unset)"
    path = resources.files("iks_gpu_migration") / "rbac" / CHARTS_FILE
    return (f"the identity of {who}{f' (User {user!r})' if user else ''} lacks permissions the Helm releases of the "
            f"GPU Operator and the DRA driver need; nothing was changed:{_bullets([c.describe() for c in lacking])}\n"
            f"bind it to the ClusterRole {CHARTS_ROLE} of {path} (`kubectl apply -f` it as a cluster admin; it holds "
            f"escalate and bind on RBAC roles, as the charts create ClusterRoles: see docs/permissions.md)")


def _unchecked(key: str, error: ApiException) -> None:
    pulumi.log.warn(f"the permissions of {key} could not be checked up front ({_short(error)}); a missing one stops "
                    f"`up` at the request it refuses")


def require(api, shared_budget_namespace: Optional[str] = None, scope: Optional[dict[str, Any]] = None) -> None:
    """Stop, naming every verb and resource of the shipped roles each identity lacks. `scope` (from the stack config,
    components/migration.py permission_scope) says what else the program uses: `smoke_namespace` and `smoke_pods` (a
    node is dra), `device_class` (its own DeviceClass), `charts` (it installs the Helm releases) with
    `chart_kubeconfig` (unset: the same identity). A server that cannot answer the reviews only gets a warning: a
    missing permission then stops `up` at the request it refuses, named as clearly (refusals.py)."""
    scope = scope or {}
    separate = bool(scope.get("chart_kubeconfig"))
    try:
        lacking = missing(api, program_checks(api, shared_budget_namespace, scope))
    except ApiException as e:
        return _unchecked(KUBECONFIG_KEY, e)
    charts_lacking, chart_api = [], api
    if scope.get("charts"):
        try:
            with api_client(scope["chart_kubeconfig"]) if separate else contextlib.nullcontext(api) as chart_api:
                charts_lacking = missing(chart_api, chart_checks())
        except ApiException as e:
            _unchecked(CHART_KUBECONFIG_KEY if separate else KUBECONFIG_KEY, e)
    parts = []
    if lacking:
        user = whoami(api)
        parts.append(f"the identity of {KUBECONFIG_KEY}{f' (User {user!r})' if user else ''} lacks permissions the "
                     f"program needs; nothing was changed:{_bullets([c.describe() for c in lacking])}\n"
                     f"{_program_fix(lacking, shared_budget_namespace, scope)}")
    if charts_lacking:
        parts.append(_charts_part(chart_api, charts_lacking, separate))
    if parts:
        raise PermissionDenied("\n".join(parts))
