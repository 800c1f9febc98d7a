"""Which pending create becomes what (pure): the ID pulumi-kubernetes would have given it, whether this stack made the
object (its server-side-apply field manager, a Helm release's first deploy), and the deployment with the adopted
ones moved into its resources."""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
_K8S = "kubernetes:"
# The provider keeps the server-side-apply field manager only in the resource's outputs, under this key
# (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go: fieldManagerKey, checkpointObject).
FIELD_MANAGER_KEY = "__fieldManager"
# Its name when no annotation sets one: "pulumi-kubernetes-" and 8 random hex digits (provider.go fieldManagerName,
# pulumi sdk go/common/resource/resource_id.go NewUniqueName); an input annotation overrides it.
_GENERATED_MANAGER = re.compile(r"pulumi-kubernetes-[0-9a-f]{8}")
MANAGER_ANNOTATION = "pulumi.com/patchFieldManager"  # provider/pkg/metadata/annotations.go


@dataclass(frozen=True)
class Step:
    """What recover does with one pending create. `forced`: only with --force (this stack can't be shown to have
    made the object); `why` says why, in words for the operator."""
    urn: str
    action: str  # "adopt" | "clear" | "remove-records"
    why: str
    id: Optional[str] = None
    field_manager: Optional[str] = None
    records: tuple[str, ...] = ()  # Helm release records (Secrets) to delete, in `namespace`
    namespace: Optional[str] = None
    forced: bool = False


@dataclass(frozen=True)
class HelmRecord:
    """One revision of a Helm release as Helm stores it (a Secret `sh.helm.release.v1.<name>.v<revision>`,
    helm/helm pkg/storage/driver/secrets.go): its status label and the release's `info.first_deployed`."""
    secret: str
    revision: int
    status: str
    first_deployed: Optional[datetime]


def provider_id(resource: dict[str, Any]) -> Optional[str]:
    """The ID pulumi-kubernetes gives what this pending create would have made, or None (nothing to import):
    `<namespace>/<name>` for namespaced objects and Helm releases, `<name>` for cluster-scoped objects
    (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go: Create returns the object's fully qualified name)."""
    typ, inputs = resource.get("type", ""), resource.get("inputs") or {}
    if not typ.startswith(_K8S):
        return None
    if typ == HELM_RELEASE:
        name, namespace = inputs.get("name"), inputs.get("namespace") or "default"
        return f"{namespace}/{name}" if name else None
    if typ.endswith("Patch"):
        return None  # a patch owns fields of an object it did not create: the next `up` applies it again
    meta = inputs.get("metadata") or {}
    name = meta.get("name")
    if not name:
        return None
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


def pending_creates(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return [op["resource"] for op in deployment.get("pending_operations") or [] if op.get("type") == "creating"]


def pulumi_managers(resource: dict[str, Any], managed_fields: list[dict[str, Any]]) -> list[str]:
    """The server-side-apply managers in an object's `metadata.managedFields` that are pulumi-kubernetes' for this
    resource, newest first: the name its inputs' annotation sets, else the generated `pulumi-kubernetes-<8 hex>`."""
    annotations = ((resource.get("inputs") or {}).get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(MANAGER_ANNOTATION)
    found = [(m.get("time") or "", m.get("manager") or "") for m in managed_fields if m.get("operation") == "Apply"]
    names = [name for _, name in sorted(found, reverse=True)
             if (name == wanted if wanted else _GENERATED_MANAGER.fullmatch(name))]
    return list(dict.fromkeys(names))


def applied_at(managed_fields: list[dict[str, Any]], manager: str) -> Optional[datetime]:
    """When `manager` last applied the object (managedFields `time`, RFC 3339 to the second), None if not recorded."""
    times = [m.get("time") for m in managed_fields if m.get("manager") == manager and m.get("operation") == "Apply"]
    try:
        return max(datetime.fromisoformat(t) for t in times if t)
    except ValueError:  # no time recorded, or one that doesn't parse
        return None


def decide_object(resource: dict[str, Any], managed_fields: Optional[list[dict[str, Any]]],
                  killed_start: Optional[datetime], start_source: str) -> Step:
    """A plain Kubernetes object: adopted (with its field manager) when pulumi-kubernetes applied it during the killed
    update; `managed_fields` is None when the object does not exist. Another Pulumi stack's object carries a
    pulumi-kubernetes manager too: only one that applied it after the killed update started is this update's."""
    urn, rid = resource["urn"], provider_id(resource)
    if rid is None:
        return Step(urn, "clear", "its step resumes from the real state on the next `up`")
    if managed_fields is None:
        return Step(urn, "clear", f"{rid} is not in the cluster: the next `up` creates it")
    managers = pulumi_managers(resource, managed_fields)
    if len(managers) == 1:
        when = applied_at(managed_fields, managers[0])
        # managedFields times are cut to the second; the lock's timestamp is not
        if killed_start is None or when is None or when < killed_start.replace(microsecond=0):
            return Step(urn, "adopt", f"{rid} was applied by pulumi-kubernetes (field manager {managers[0]}) "
                        f"{_when(when)}, and the killed update started {_when(killed_start)} ({start_source}): "
                        f"another Pulumi stack may have made it, and once adopted a later change or destroy of "
                        f"this stack deletes it", rid, managers[0], forced=True)
        return Step(urn, "adopt", f"pulumi-kubernetes applied it (field manager {managers[0]}) {_when(when)}, after "
                    f"the killed update started", rid, managers[0])
    if managers:
        return Step(urn, "adopt", f"{rid} has several pulumi-kubernetes field managers ({', '.join(managers)}): "
                    f"another Pulumi stack may manage it too", rid, managers[0], forced=True)
    others = sorted({m.get("manager") or "?" for m in managed_fields}) or ["none"]
    return Step(urn, "adopt", f"{rid} has no pulumi-kubernetes field manager (managers: {', '.join(others)}): "
                f"something else made it, and once adopted a later change or destroy of this stack deletes it",
                rid, forced=True)


def decide_release(resource: dict[str, Any], records: list[HelmRecord], killed_start: Optional[datetime],
                   start_source: str) -> Step:
    """A Helm release: adopted (or its killed install's `pending-install` records removed, so the next `up` installs
    it again) only when it was first deployed after the killed update started."""
    urn, rid = resource["urn"], provider_id(resource)
    if rid is None or not records:
        return Step(urn, "clear", f"no Helm release {rid}: the next `up` installs it")
    namespace = rid.split("/", 1)[0]
    first = min(records, key=lambda r: r.revision).first_deployed
    if killed_start is None:
        forced, why = True, (f"first deployed {_when(first)}, but the killed update's start is unknown "
                             f"({start_source}), so recover can't tell whether this stack installed it")
    elif first is None or first < killed_start:
        forced, why = True, (f"first deployed {_when(first)}, before the killed update started ({_when(killed_start)}"
                             f", {start_source}): this stack did not install it")
    else:
        forced, why = False, f"first deployed {_when(first)}, after the killed update started ({_when(killed_start)})"
    stuck = tuple(r.secret for r in records if r.status == "pending-install")
    if stuck and len(stuck) == len(records):
        risk = "; removing its record drops another's install" if forced else ""
        return Step(urn, "remove-records", f"its install was killed (pending-install); {why}{risk}",
                    records=stuck, namespace=namespace, forced=forced)
    risk = "; once adopted, a later stage change or destroy deletes it" if forced else ""
    return Step(urn, "adopt", why + risk, rid, forced=forced)


def _when(t: Optional[datetime]) -> str:
    return t.isoformat(timespec="seconds") if t else "at an unknown time"


def with_force(steps: list[Step], force: bool) -> tuple[list[Step], list[Step]]:
    """(the steps to take, the steps refused): a forced step is taken only with --force."""
    if force:
        return list(steps), []
    return [s for s in steps if not s.forced], [s for s in steps if s.forced]


def adopt_pending(deployment: dict[str, Any], steps: list[Step]) -> dict[str, Any]:
    """The deployment with the adopted pending creates moved into its resources and every other pending operation
    dropped (`pulumi stack import` drops them anyway, pkg/cmd/pulumi/stack/io.go SaveSnapshot). An adopted resource
    gets its ID and, for a plain object, only its field manager as outputs, so the refresh that follows reads it the
    way an import does (pulumi-kubernetes provider.go Read and helm_release.go: Read with no live state in the old
    outputs takes the object from its ID) and keeps that manager (provider.go fieldManagerName reads the old state
    first): the next change applies as the manager that owns the fields, not a new one that would conflict with it.
    `__initialApiVersion` needs no seed: Read falls back to the inputs' apiVersion, the one Create stores
    (provider.go initialAPIVersion). Appended last, an adopted resource follows everything it depends on, as the
    state's order requires.

    Pulumi's own `refresh --import-pending-creates` can't do this: it rewrites the operation to `importing`, and the
    3.274 engine keeps only pending *creates* from the base snapshot (pkg/backend/snapshot.go, `Snap`), so the
    resource is dropped, never imported, and the next `up` installs the Helm release again ("cannot re-use a name
    that is still in use")."""
    adopted = {s.urn: s for s in steps if s.action == "adopt"}
    resources = list(deployment.get("resources") or [])
    for r in pending_creates(deployment):
        step = adopted.get(r["urn"])
        if step:
            outputs = {FIELD_MANAGER_KEY: step.field_manager} if step.field_manager else {}
            resources.append({**r, "id": step.id, "outputs": outputs})
    return {**deployment, "resources": resources, "pending_operations": []}


def never_read(deployment: dict[str, Any]) -> list[str]:
    """URNs of Kubernetes resources recover adopted that no refresh has read yet (an ID, no live state in the
    outputs: the refresh after the import failed). A `pulumi up` now would diff them against nothing."""
    return [r["urn"] for r in deployment.get("resources") or []
            if r.get("type", "").startswith(_K8S) and r.get("id")
            and not any(not k.startswith("__") for k in r.get("outputs") or {})]
