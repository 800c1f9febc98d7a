"""Kubernetes' refusals of the program's requests, kept readable: the API server's own message (which names the user,
the verb and the resource) and what to do about it, never a bare "HTTP 403 Forbidden"."""
import contextlib
import json
from importlib import resources
from typing import Any, Iterator, Optional

ROLE_FILE = "gpu-migration.yaml"
ROLE_NAME = "gpu-migration"
KUBECONFIG_KEY = "gpu-migration:kubeconfig"
# How the API server words an RBAC refusal (k8s.io/apiserver pkg/endpoints/handlers/responsewriters/errors.go
# forbiddenMessage): `User "<name>" cannot <verb> resource "<resource>" in API group "<group>" ...`.
REFUSAL = " cannot "


class PermissionDenied(RuntimeError):
    """Kubernetes refused a request of the program (RBAC), or the identity lacks a rule of the shipped role."""


def status_message(error: Any) -> str:
    """The message of the Kubernetes Status the API server answered with, e.g. for a 403 `nodes "n1" is forbidden:
    User "u" cannot patch resource "nodes" in API group "" at the cluster scope`; '' if the body is no Status."""
    try:
        body = json.loads(error.body) if getattr(error, "body", None) else None
    except (TypeError, ValueError):
        return ""
    return " ".join(str(body.get("message") or "").split()) if isinstance(body, dict) else ""


def role_text() -> str:
    return (resources.files("iks_gpu_migration") / "rbac" / ROLE_FILE).read_text()


def role_path() -> str:
    return str(resources.files("iks_gpu_migration") / "rbac" / ROLE_FILE)


def fix() -> str:
    return (f"bind the identity of {KUBECONFIG_KEY} to the ClusterRole {ROLE_NAME} of {role_path()} "
            f"(`kubectl apply -f` it as a cluster admin; see docs/permissions.md)")


def refusal(error: BaseException) -> Optional[str]:
    """The API server's message if `error` is an RBAC refusal (HTTP 403 naming user, verb and resource), else None.
    A 403 that is no RBAC refusal (e.g. in a namespace being terminated) is left to its caller."""
    from kubernetes.client.exceptions import ApiException  # imported when needed, as iks/ does with kubernetes

    if isinstance(error, ApiException) and error.status == 403:
        message = status_message(error)
        if REFUSAL in message:
            return message
    return None


@contextlib.contextmanager
def explained() -> Iterator[None]:
    """An RBAC refusal that escapes the block becomes PermissionDenied with Kubernetes' message and the fix."""
    try:
        yield
    except Exception as e:
        message = refusal(e)
        if message is None:
            raise
        raise PermissionDenied(f"Kubernetes refused a request of the program (HTTP 403): {message}\n{fix()}") from None
