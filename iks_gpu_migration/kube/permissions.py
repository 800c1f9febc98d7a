"""The preflight of the program's Kubernetes permissions: every verb and resource of the shipped ClusterRole
(iks_gpu_migration/rbac/gpu-migration.yaml) checked before anything changes, each missing one named.

It asks the API server itself, one SelfSubjectAccessReview per verb and resource (what `kubectl auth can-i` does): its
answer is the authorizer's decision, which a SelfSubjectRulesReview's is not ("may be incomplete depending on the
server's authorization mode ... should NOT Be used by external systems to drive authorization decisions", k8s.io/api
authorization/v1 types.go). Every authenticated user may create both (the system:basic-user ClusterRole, kubernetes
plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go).
"""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .provider import _bullets, _short
from .refusals import KUBECONFIG_KEY, ROLE_FILE, ROLE_NAME, PermissionDenied, fix, role_text


@dataclass(frozen=True)
class Check:
    group: str
    resource: str  # "pods" or "pods/eviction"
    verb: str
    namespace: str = ""  # a Role's rule (in this namespace); "" a ClusterRole's, cluster-wide

    def describe(self) -> str:
        """As the API server words a refusal."""
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        return f'cannot {self.verb} resource "{self.resource}" in API group "{self.group}" {scope}'


SHARED_BUDGET_ROLE = "gpu-migration-shared-budget"


def shared_budget_checks(namespace: str) -> list[Check]:
    """The Role gpu-migration-shared-budget of rbac/gpu-migration.yaml (kube/shared_budget.py's requests)."""
    return [Check("coordination.k8s.io", "leases", verb, namespace) for verb in ("get", "create", "update")]


def shipped_rules(text: Optional[str] = None) -> list[dict[str, Any]]:
    """The rules of the ClusterRole gpu-migration in the shipped manifest (or in `text`)."""
    for doc in yaml.safe_load_all(role_text() if text is None else text):
        if doc and doc.get("kind") == "ClusterRole" and doc["metadata"]["name"] == ROLE_NAME:
            return doc["rules"]
    raise ValueError(f"no ClusterRole {ROLE_NAME} in {ROLE_FILE}")


def checks(rules: list[dict[str, Any]]) -> list[Check]:
    """One check per group, resource and verb of the rules (pure)."""
    return [Check(group, resource, verb) for rule in rules for group in rule.get("apiGroups") or [""]
            for resource in rule["resources"] for verb in rule["verbs"]]


def _allowed(api, check: Check) -> bool:
    resource, _, subresource = check.resource.partition("/")
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(group=check.group, resource=resource,
                                                        subresource=subresource or None, verb=check.verb,
                                                        namespace=check.namespace or None)))
    return bool(client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed)


def whoami(api) -> str:
    """The user the API server sees (a SelfSubjectReview, as `kubectl auth whoami`); '' if it can't be told."""
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
        return (review.status.user_info.username or "") if review.status and review.status.user_info else ""
    except Exception:  # noqa: BLE001 - it only adds the name to the message
        return ""


def missing(api, wanted: Optional[list[Check]] = None) -> list[Check]:
    """The checks the kubeconfig's identity fails (by default every one of the shipped role)."""
    wanted = checks(shipped_rules()) if wanted is None else wanted
    with ThreadPoolExecutor(max_workers=8) as pool:
        allowed = list(pool.map(lambda c: _allowed(api, c), wanted))
    return [c for c, ok in zip(wanted, allowed) if not ok]


def require(api, shared_budget_namespace: Optional[str] = None) -> None:
    """Stop, naming every verb and resource of the shipped role the identity lacks (and, with a shared budget, of the
    Role for its Lease). A server that cannot answer the reviews only gets a warning: a missing permission then stops
    `up` at the request it refuses, named as clearly (refusals.py)."""
    wanted = checks(shipped_rules()) + (shared_budget_checks(shared_budget_namespace) if shared_budget_namespace
                                        else [])
    try:
        lacking = missing(api, wanted)
    except ApiException as e:
        pulumi.log.warn(f"the permissions of {KUBECONFIG_KEY} could not be checked up front ({_short(e)}); a missing "
                        f"one stops `up` at the request it refuses")
        return
    if lacking:
        user = whoami(api)
        raise PermissionDenied(
            f"the identity of {KUBECONFIG_KEY}{f' (User {user!r})' if user else ''} lacks permissions the program "
            f"needs; nothing was changed:{_bullets([c.describe() for c in lacking])}\n{fix()}"
            + (f" (the leases: the Role {SHARED_BUDGET_ROLE} of the same file, in namespace "
               f"{shared_budget_namespace})" if any(c.namespace for c in lacking) else ""))
