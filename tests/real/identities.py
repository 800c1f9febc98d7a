"""The shipped RBAC manifests (iks_gpu_migration/rbac/) applied to a real API server, and a kubeconfig per
ServiceAccount they bind (a bound token from the TokenRequest API, as `kubectl create token` gets one)."""
import json
import pathlib
from typing import Callable, Optional

import yaml
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from gpu_migration_local.control_plane import write_private

RBAC = pathlib.Path(__file__).resolve().parents[2] / "iks_gpu_migration" / "rbac"


def manifest(name: str, edit: Optional[Callable[[dict], None]] = None) -> list[dict]:
    """The documents of rbac/<name>.yaml; `edit` may change each (e.g. drop a rule of the ClusterRole)."""
    docs = [d for d in yaml.safe_load_all((RBAC / f"{name}.yaml").read_text()) if d]
    for doc in docs:
        if edit:
            edit(doc)
    return docs


def apply(api: client.ApiClient, docs: list[dict]) -> None:
    """Create each document, or replace it if it exists (roles are changed between runs)."""
    rbac = client.RbacAuthorizationV1Api(api)
    for doc in docs:
        try:
            utils.create_from_dict(api, doc)
        except utils.FailToCreateError as e:
            if not all(isinstance(x, ApiException) and x.status == 409 for x in e.api_exceptions):
                raise
            if doc["kind"] == "ClusterRole":
                rbac.replace_cluster_role(doc["metadata"]["name"], doc)


def without(resource: str, verb: str, role: str = "gpu-migration") -> Callable[[dict], None]:
    """An edit of the ClusterRole `role` that takes `verb` off its rules for `resource`."""
    def edit(doc: dict) -> None:
        if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == role:
            for rule in doc["rules"]:
                if resource in rule["resources"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    return edit


def kubeconfig_for(api: client.ApiClient, admin_kubeconfig: pathlib.Path, namespace: str, name: str,
                   path: pathlib.Path) -> str:
    """A kubeconfig (0600) for ServiceAccount namespace/name on the cluster of `admin_kubeconfig`."""
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    cfg = json.loads(admin_kubeconfig.read_text())
    cfg["users"] = [{"name": name, "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = name
    write_private(path, json.dumps(cfg))
    return str(path)
