"""Which IBM Cloud IAM platform role on containers-kubernetes each IKS call of the client needs, and a refused call's
error that names it.

IBM Cloud's map of API methods to IAM actions (ibm-cloud-docs/containers api-at-iam.md): GET /v2/vpc/getCluster,
/v2/vpc/getWorkers, /v2/vpc/getWorker, /v2/vpc/getWorkerPool and /v1/versions are `containers-kubernetes.cluster.read`;
PUT /v1/clusters/{idOrName} (master update), POST /v2/vpc/replaceWorker, POST /v2/vpc/createWorkerPool and DELETE
/v1/clusters/{idOrName}/workerpools/{poolidOrName} are `containers-kubernetes.cluster.operate`. `cluster.read` comes
with Viewer (and every higher role), `cluster.operate` with Operator and Administrator only
(iam-platform-access-roles.md). The roles are set per call on IksClient (api.py) with `needs`.
"""
import functools
from typing import Any, Callable, TypeVar

SERVICE = "containers-kubernetes"
VIEWER, OPERATOR = "Viewer", "Operator"
DOC = "docs/permissions.md"

F = TypeVar("F", bound=Callable[..., Any])


def advice(role: str, cluster: str = "") -> str:
    scope = f" for cluster {cluster}" if cluster else ""
    return (f"the API key's identity needs the {role} platform role on {SERVICE}{scope} (IBM Cloud IAM; "
            f"{DOC} shows the service ID and its policy)")


def needs(role: str) -> Callable[[F], F]:
    """An IksClient method that needs `role`: a 403 answer (IAM refused the action) gets the role named. The error
    keeps its type and fields; only its message grows. The method's first argument, if any, is the cluster."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def call(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as e:
                if getattr(e, "status_code", None) != 403:
                    raise
                cluster = str(args[0]) if args else str(kwargs.get("cluster") or "")
                raise type(e)(f"{e}; {advice(role, cluster)}", 403, getattr(e, "code", None)) from None
        call.role = role  # type: ignore[attr-defined]  # read by docs/tests: which call needs which role
        return call  # type: ignore[return-value]
    return wrap
