"""The shared budget's Lease: the claims of every stack that migrates GPU nodes of this cluster
(gpu-migration:sharedBudget; the decisions are plan/shared_budget.py).

One Lease per budget (`gpu-migration-budget-<name>` in `sharedBudget.namespace`) holds the claims as an annotation:
one entry per stack, the batch it has out. Every change reads the Lease and writes it back with the resourceVersion
it read, so two stacks' gates can't both take the last room: the API server refuses the second write (409 Conflict,
optimistic concurrency: k8s.io/apiserver storage GuaranteedUpdate; client-go tools/leaderelection/resourcelock
LeaseLock.Update works the same way) and that gate reads again. Within one stack every dynamic resource runs in one
provider process, so its own writes go one at a time (`_LOCK`) and conflicts only come from other stacks.

A stack's provider process renews its claim every third of `claim_ttl` while it holds one (Heartbeat). A claim not
renewed within `claim_ttl` (its `up` died) no longer counts: the nodes such a stack drained count anyway, as
unavailable nodes (plan/shared_budget.py), and the nodes it claimed but never touched are in service. The next write
drops it and warns, naming the stack. A stack's next `up` claims its batch again before its next drain.
"""
import datetime
import random
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence, TypeVar

import pulumi
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

from ..common.waiting import Interrupted, interruptible_sleep
from ..plan import shared_budget as decide
from ..plan.gates import NodeView
from .permissions import SHARED_BUDGET_ROLE
from .clients import api_client
from .provider import CheckFailed, _Provider, _short
from .refusals import PermissionDenied, status_message

LEASE_PREFIX = "gpu-migration-budget-"
CLAIMS_ANNOTATION = "migration.example.com/budget-claims"
LIMIT_ANNOTATION = "migration.example.com/budget-limit"
MEMBERS_ANNOTATION = "migration.example.com/budget-stacks"  # each stack's worker pools and configured GPU nodes
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
        lease, claims, limit, _ = self.read_all()
        return lease, claims, limit

    def read_all(self) -> tuple[Optional[client.V1Lease], decide.Claims, Optional[int], decide.Members]:
        """The Lease, its claims, its recorded limit and the stacks' members."""
        try:
            lease = self.api.read_namespaced_lease(self.lease_name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None, {}, None, {}
            raise
        annotations = lease.metadata.annotations or {}
        return (lease, decide.parse_claims(annotations.get(CLAIMS_ANNOTATION)),
                decide.limit_from(annotations, LIMIT_ANNOTATION),
                decide.parse_members(annotations.get(MEMBERS_ANNOTATION)))

    def change(self, holder: str, step: Callable[[decide.Claims, Optional[int]], tuple[T, decide.Claims, int]],
               members: Optional[Callable[[decide.Members], decide.Members]] = None) -> T:
        """`members(recorded)` -> the stacks' members to write (default: unchanged), called first, then
        `step(claims, recorded limit)` -> (result, claims to write, limit to write); written only if it changed
        anything, with the resourceVersion read (a conflict reads again)."""
        with _LOCK:
            for _ in range(CONFLICT_ATTEMPTS):
                try:
                    lease, claims, recorded, known = self.read_all()
                except ApiException as e:
                    raise self._explained(e) from None
                new_members = members(known) if members else known
                result, new_claims, limit = step(claims, recorded)
                if lease is not None and (new_claims, limit, new_members) == (claims, recorded, known):
                    return result
                try:
                    self._write(lease, holder, new_claims, limit, new_members)
                    return result
                except ApiException as e:
                    if e.status != 409:
                        raise self._explained(e) from None
                time.sleep(random.uniform(0, 0.2))  # another stack wrote first
        raise CheckFailed(f"the shared budget's Lease {self.namespace}/{self.lease_name} changed under every one of "
                          f"{CONFLICT_ATTEMPTS} writes; run `pulumi up` again")

    def _write(self, lease: Optional[client.V1Lease], holder: str, claims: decide.Claims, limit: int,
               members: Optional[decide.Members] = None) -> None:
        annotations = {CLAIMS_ANNOTATION: decide.dump_claims(claims), LIMIT_ANNOTATION: str(limit),
                       **({MEMBERS_ANNOTATION: decide.dump_members(members)} if members else {})}
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


def claim_ttl(shared: dict[str, Any]) -> Optional[float]:
    value = shared.get("claim_ttl")
    return float(value) if value not in (None, "") else None


def aliases(shared: dict[str, Any]) -> frozenset[str]:
    """Older holder names of this stack (before holders carried the stack's own ID): its claims under them are its."""
    return frozenset(filter(None, [shared.get("legacy_holder")])) - {shared["holder"]}


def member(shared: dict[str, Any]) -> decide.Member:
    """This stack in the fleet: its worker pools (none: every pool) and its configured GPU nodes."""
    return decide.Member(tuple(sorted(shared.get("pools") or ())), int(shared.get("nodes") or 0))


def try_admit(api, shared: dict[str, Any], index: int, batch: list[str], fits_locally: bool,
              views: Optional[Sequence[NodeView]] = None, selector: str = "",
              kubeconfig: Optional[str] = None, merge: bool = False) -> decide.Admission:
    """One attempt: claim the batch (if the stack's own budget lets it out too) when the fleet leaves room for it,
    and in the same write drop the stack's previous claim (its batch is done) and every expired claim, and record
    this stack's member (pools, nodes). With `views` (every Node) and `selector` the fleet's nodes out are counted
    from the cluster (plan/fleet_count.py); without, from the claims alone. Called by each gate and again right
    before each drain (kube/drain_budget.py): a drain of a resumed stack whose claim is gone claims its batch again.
    `kubeconfig`: the cluster of `api`, for the heartbeat that then keeps the claim. `merge` (a drain): the claim
    keeps the stack's other nodes (plan/shared_budget.py admission)."""
    holder, limit, name = shared["holder"], int(shared["max_unavailable"]), shared["name"]
    own, mine = aliases(shared), member(shared) if shared.get("nodes") else None
    members: list[decide.Members] = [{}]  # this attempt's members, as written (BudgetLease.change calls it first)

    def with_mine(known: decide.Members) -> decide.Members:
        members[0] = decide.with_member(known, holder, mine, own) if mine else known
        return members[0]

    def step(claims: decide.Claims, recorded: Optional[int]):
        new_limit = decide.check_limit(recorded, limit, {h: c for h, c in claims.items() if h not in own}, holder,
                                       name)
        fleet = None if views is None else decide.Fleet(tuple(views), selector, members[0])
        admission = decide.admission(claims, new_limit, holder, index, tuple(batch), now(), name, fleet,
                                     claim_ttl(shared), own, merge)
        if not fits_locally:  # not out yet: only the previous claim goes (and the expired ones)
            return admission, {h: c for h, c in admission.claims.items() if h != holder}, new_limit
        return admission, admission.claims, new_limit

    try:
        admission = BudgetLease(api, shared["namespace"], name).change(holder, step, with_mine)
    except decide.SharedBudgetError as e:
        raise CheckFailed(str(e)) from None
    warn_expired(shared, admission.expired)
    if admission.open and fits_locally:
        HEARTBEATS.keep(shared, kubeconfig)
    return admission


_WARNED: set[tuple[str, str, str]] = set()


def warn_expired(shared: dict[str, Any], expired: decide.Claims) -> None:
    """Once per stack and claim: another stack's claim expired (its `up` stopped renewing it)."""
    for holder, c in sorted(expired.items()):
        key = (shared["name"], holder, c.since)
        if key in _WARNED:
            continue
        _WARNED.add(key)
        pulumi.log.warn(f"{settings_text(shared)}: the claim of stack {holder} ({c.describe(holder)}, last renewed "
                        f"{c.heartbeat}) expired after {claim_ttl(shared):.0f}s without a renewal (its `pulumi up` is "
                        f"not running): it no longer counts; the nodes that stack took out still count as "
                        f"unavailable. Its next `up` claims its batch again")


class Heartbeats:
    """Renews this process's claims (one per shared budget and holder) every third of their `claim_ttl`, until the
    claim is gone (released, or dropped by hand) or the process ends; each renewal is one Lease write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[tuple[str, str, str]] = set()

    def keep(self, shared: dict[str, Any], kubeconfig: Optional[str]) -> None:
        ttl = claim_ttl(shared)
        key = (shared["namespace"], shared["name"], shared["holder"])
        if ttl is None:
            return
        with self._lock:
            if key in self._running:
                return
            self._running.add(key)
        threading.Thread(target=self._run, args=(key, shared, kubeconfig, ttl / 3), daemon=True,
                         name=f"budget-heartbeat-{shared['name']}").start()

    def _run(self, key: tuple[str, str, str], shared: dict[str, Any], kubeconfig: Optional[str],
             every: float) -> None:
        try:
            while True:
                interruptible_sleep(every)
                if not renew(shared, kubeconfig):
                    return
        except Exception as e:  # noqa: BLE001 - a lost heartbeat lets the claim expire, which is safe; say so
            if not isinstance(e, Interrupted):
                pulumi.log.warn(f"{settings_text(shared)}: renewing the claim of {shared['holder']} failed "
                                f"({_short(e)}); it expires after {claim_ttl(shared):.0f}s unless a gate or drain "
                                f"of this stack writes it again")
        finally:
            with self._lock:
                self._running.discard(key)


HEARTBEATS = Heartbeats()


def renew(shared: dict[str, Any], kubeconfig: Optional[str] = None) -> bool:
    """One heartbeat: this stack's claim renewed now; False (and nothing written) when it holds none."""
    holder = shared["holder"]

    def step(claims: decide.Claims, recorded: Optional[int]):
        return holder in claims, decide.renewed(claims, holder, now()), recorded if recorded is not None else int(
            shared["max_unavailable"])

    with api_client(kubeconfig) as api:
        return BudgetLease(api, shared["namespace"], shared["name"]).change(holder, step)


def release(api, shared: dict[str, Any], leave: bool = False) -> bool:
    """Drop the stack's claim (also under an older holder name); True if it held one. `leave`: its member too."""
    holder, own = shared["holder"], {shared["holder"], *aliases(shared)}

    def step(claims: decide.Claims, recorded: Optional[int]):
        return bool(own & set(claims)), {h: c for h, c in claims.items() if h not in own}, \
            recorded if recorded is not None else int(shared["max_unavailable"])

    members = (lambda known: decide.with_member(known, holder, None, frozenset(own))) if leave else None
    try:
        return BudgetLease(api, shared["namespace"], shared["name"]).change(holder, step, members)
    except decide.SharedBudgetError as e:
        raise CheckFailed(str(e)) from None


def timeout_advice(shared: dict[str, Any]) -> str:
    ttl = claim_ttl(shared)
    expiry = f"; a claim not renewed for {ttl:.0f}s (its `up` stopped) expires by itself" if ttl else ""
    return (f"The fleet's unavailable GPU nodes and the other stacks' batches hold {settings_text(shared)}: a stack "
            f"releases its claim when its batch is done{expiry}. Make unavailable GPU nodes available again (uncordon "
            f"or repair them); to drop a stopped stack's claim at once, `python -m iks_gpu_migration.cli.budget --name "
            f"{shared['name']} --release <stack>`")


class _SharedBudgetHolderProvider(ResourceProvider):
    """This stack's name in the shared budget's claims: org/project/stack (DIY backends call every organization
    "organization", so two backends' stacks of one name would collide) and an ID drawn once, kept in the stack's
    state for its life. Touches nothing."""
    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> CreateResult:
        holder = f"{props['base']}#{uuid.uuid4().hex[:8]}"
        return CreateResult(id_=holder, outs={**props, "holder": holder})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        renamed = olds.get("base") != news.get("base")
        return DiffResult(changes=renamed, replaces=["base"] if renamed else [], delete_before_replace=False)


class SharedBudgetHolder(Resource, module="gpu-migration", name="SharedBudgetHolder"):
    """`holder`: this stack's unique name in a shared budget's claims."""
    holder: pulumi.Output[str]

    def __init__(self, name: str, base: str, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(_SharedBudgetHolderProvider(), name, {"base": base, "holder": None}, opts)


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
        """A destroyed stack (or a plan that changed) takes its claim with it, and its member (it no longer counts in
        the fleet)."""
        with api_client(props.get("kubeconfig")) as api:
            release(api, props["shared"], leave=True)


class SharedBudgetRelease(Resource, module="gpu-migration", name="SharedBudgetRelease"):
    """After the last batch of the plan: drops this stack's claim in the shared budget."""

    def __init__(self, name: str, kubeconfig: pulumi.Input[Optional[str]], shared: dict[str, Any], plan: str,
                 after: pulumi.Input[Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(_SharedBudgetReleaseProvider(), name,
                         dict(kubeconfig=kubeconfig, shared=shared, plan=plan, after=after), opts)

