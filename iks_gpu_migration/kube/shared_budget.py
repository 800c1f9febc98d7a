"""The shared budget's Lease: the claims of every stack that migrates GPU nodes of this cluster
(gpu-migration:sharedBudget; the decisions are plan/shared_budget.py).

One Lease per budget (`gpu-migration-budget-<name>` in `sharedBudget.namespace`) holds the claims as an annotation:
one entry per stack, the batch it has out. Every change reads the Lease and writes it back with the resourceVersion
it read, so two stacks' gates can't both take the last room: the API server refuses the second write (409 Conflict,
optimistic concurrency: k8s.io/apiserver storage GuaranteedUpdate; client-go tools/leaderelection/resourcelock
LeaseLock.Update works the same way) and that gate reads again. Within one stack every dynamic resource runs in one
provider process, so its own writes go one at a time (`_LOCK`) and conflicts only come from other stacks.

The claims don't expire: a stack whose `up` stopped still has its batch out (cordoned, drained or replaced nodes), so
its claim stays until its next `up` finishes that batch (the next gate or SharedBudgetRelease drops it), or until
`python -m iks_gpu_migration.cli.budget --release <stack>` drops it by hand.
"""
import datetime
import random
import threading
import time
from typing import Any, Callable, Optional, TypeVar

import pulumi
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import Resource

from ..plan import shared_budget as decide
from .permissions import SHARED_BUDGET_ROLE
from .clients import api_client
from .provider import CheckFailed, _Provider, _short
from .refusals import PermissionDenied, status_message

LEASE_PREFIX = "gpu-migration-budget-"
CLAIMS_ANNOTATION = "migration.example.com/budget-claims"
LIMIT_ANNOTATION = "migration.example.com/budget-limit"
CONFLICT_ATTEMPTS = 20  # writes refused because another stack wrote first; each read again at once
_LOCK = threading.Lock()
T = TypeVar("T")


def lease_name(name: str) -> str:
    return f"{LEASE_PREFIX}{name}"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


class BudgetLease:
    """The Lease of one shared budget, read and changed with optimistic concurrency."""

    def __init__(self, api, namespace: str, name: str):
        self.api, self.namespace, self.name = client.CoordinationV1Api(api), namespace, name
        self.lease_name = lease_name(name)

    def read(self) -> tuple[Optional[client.V1Lease], decide.Claims, Optional[int]]:
        try:
            lease = self.api.read_namespaced_lease(self.lease_name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None, {}, None
            raise
        annotations = lease.metadata.annotations or {}
        return (lease, decide.parse_claims(annotations.get(CLAIMS_ANNOTATION)),
                decide.limit_from(annotations, LIMIT_ANNOTATION))

    def change(self, holder: str, step: Callable[[decide.Claims, Optional[int]], tuple[T, decide.Claims, int]]) -> T:
        """`step(claims, recorded limit)` -> (result, claims to write, limit to write); written only if it changed
        anything, with the resourceVersion read (a conflict reads again)."""
        with _LOCK:
            for _ in range(CONFLICT_ATTEMPTS):
                try:
                    lease, claims, recorded = self.read()
                except ApiException as e:
                    raise self._explained(e) from None
                result, new_claims, limit = step(claims, recorded)
                if lease is not None and new_claims == claims and limit == recorded:
                    return result
                try:
                    self._write(lease, holder, new_claims, limit)
                    return result
                except ApiException as e:
                    if e.status != 409:
                        raise self._explained(e) from None
                time.sleep(random.uniform(0, 0.2))  # another stack wrote first
        raise CheckFailed(f"the shared budget's Lease {self.namespace}/{self.lease_name} changed under every one of "
                          f"{CONFLICT_ATTEMPTS} writes; run `pulumi up` again")

    def _write(self, lease: Optional[client.V1Lease], holder: str, claims: decide.Claims, limit: int) -> None:
        annotations = {CLAIMS_ANNOTATION: decide.dump_claims(claims), LIMIT_ANNOTATION: str(limit)}
        spec = client.V1LeaseSpec(holder_identity=holder)  # the stack that changed it last
        if lease is None:
            body = client.V1Lease(metadata=client.V1ObjectMeta(
                name=self.lease_name, annotations=annotations,
                labels={"app.kubernetes.io/name": "gpu-migration"}), spec=spec)
            self.api.create_namespaced_lease(self.namespace, body)  # 409 if another stack created it first
            return
        lease.metadata.annotations = {**(lease.metadata.annotations or {}), **annotations}
        lease.spec = spec
        self.api.replace_namespaced_lease(self.lease_name, self.namespace, lease)  # carries the resourceVersion read

    def _explained(self, e: ApiException) -> Exception:
        if e.status == 404:
            return CheckFailed(
                f"the shared budget's namespace {self.namespace!r} does not exist: apply "
                f"iks_gpu_migration/rbac/gpu-migration.yaml (it creates gpu-migration) or set "
                f"gpu-migration:sharedBudget.namespace to an existing one ({_short(e)})")
        if e.status == 403:
            return PermissionDenied(
                f"Kubernetes refused a request for the shared budget's Lease {self.namespace}/{self.lease_name} "
                f"(HTTP 403): {status_message(e)}\nbind the identity of gpu-migration:kubeconfig to the Role "
                f"{SHARED_BUDGET_ROLE} of iks_gpu_migration/rbac/gpu-migration.yaml, in namespace {self.namespace}")
        return e


def settings_text(s: dict[str, Any]) -> str:
    return f"shared budget {s['name']!r} (Lease {s['namespace']}/{lease_name(s['name'])})"


def try_admit(api, shared: dict[str, Any], index: int, batch: list[str], fits_locally: bool) -> decide.Admission:
    """One attempt: claim the batch (if the stack's own budget lets it out too), and in the same write drop the
    stack's previous claim (its batch is done)."""
    holder, limit, name = shared["holder"], int(shared["max_unavailable"]), shared["name"]

    def step(claims: decide.Claims, recorded: Optional[int]):
        new_limit = decide.check_limit(recorded, limit, claims, holder, name)
        admission = decide.admission(claims, new_limit, holder, index, tuple(batch), now(), name)
        if not fits_locally:  # not out yet: only the previous claim goes
            return admission, decide.released(claims, holder), new_limit
        return admission, admission.claims, new_limit

    try:
        return BudgetLease(api, shared["namespace"], name).change(holder, step)
    except decide.SharedBudgetError as e:
        raise CheckFailed(str(e)) from None


def release(api, shared: dict[str, Any]) -> bool:
    """Drop the stack's claim; True if it held one."""
    holder = shared["holder"]

    def step(claims: decide.Claims, recorded: Optional[int]):
        return holder in claims, decide.released(claims, holder), recorded if recorded is not None else int(
            shared["max_unavailable"])

    try:
        return BudgetLease(api, shared["namespace"], shared["name"]).change(holder, step)
    except decide.SharedBudgetError as e:
        raise CheckFailed(str(e)) from None


def timeout_advice(shared: dict[str, Any]) -> str:
    return (f"The other stacks' batches hold {settings_text(shared)}: they release it when their batch is done. A "
            f"stack whose `up` stopped keeps its batch out until its next `up` finishes the batch; if its nodes are "
            f"back in service and no `up` of it runs, drop its claim with `python -m iks_gpu_migration.cli.budget "
            f"--name {shared['name']} --release <stack>`")


class _SharedBudgetReleaseProvider(_Provider):
    # plan: a fingerprint of every gate's inputs that re-run it: whenever a gate may have claimed again, this runs
    # again (after the last batch) and drops the claim.
    rerun_on = ("plan",)

    def run(self, api, p):
        shared = p["shared"]
        was = release(api, shared)
        pulumi.log.info(f"{settings_text(shared)}: {'released the claim of the last batch' if was else 'no claim held'}"
                        f" by {shared['holder']}")
        return {}

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        """A destroyed stack (or a plan that changed) takes its claim with it."""
        with api_client(props.get("kubeconfig")) as api:
            release(api, props["shared"])


class SharedBudgetRelease(Resource, module="gpu-migration", name="SharedBudgetRelease"):
    """After the last batch of the plan: drops this stack's claim in the shared budget."""

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], shared: dict[str, Any], plan: str,
                 after: pulumi.Input[Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(_SharedBudgetReleaseProvider(), name,
                         dict(kubeconfig=kubeconfig, shared=shared, plan=plan, after=after), opts)

