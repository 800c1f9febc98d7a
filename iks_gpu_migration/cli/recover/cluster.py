"""What the cluster holds for a pending create: a plain object's `metadata.managedFields`, a Helm release's records;
and the one change recover makes there, removing the records of a Helm install the kill cut short."""
from __future__ import annotations

import base64
import gzip
import json
from typing import Any, Optional

from .adopt import HelmRecord
from .backend import parse_time

REQUEST_TIMEOUT = 30  # seconds per API call


def api_version_kind(resource: dict[str, Any]) -> tuple[str, str]:
    """The object's apiVersion and kind: from its inputs (the SDK sets both), else from its type token
    (`kubernetes:core/v1:Pod` -> v1 Pod, `kubernetes:resource.k8s.io/v1:DeviceClass`)."""
    inputs = resource.get("inputs") or {}
    _, group_version, kind = resource["type"].split(":", 2)
    group, _, version = group_version.rpartition("/")
    return inputs.get("apiVersion") or (version if group == "core" else group_version), inputs.get("kind") or kind


def decode_release(data: str) -> dict[str, Any]:
    """A Helm release record's `release` field: base64 (the Secret's) of base64 of gzipped JSON (helm/helm
    pkg/storage/driver/util.go encodeRelease)."""
    raw = base64.b64decode(base64.b64decode(data))
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


class Cluster:
    """The cluster of the stack's kubeconfig (None: KUBECONFIG / ~/.kube/config)."""

    def __init__(self, kubeconfig: Optional[str]) -> None:
        from kubernetes import client  # noqa: PLC0415 - only recover's cluster reads need it

        from ...kube.clients import new_client
        self.api = new_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)

    def _get(self, path: str) -> Optional[dict[str, Any]]:
        """GET `path` as JSON; None on 404. (The client's generic request: param_serialize, call_api.)"""
        method, url, headers, body, post = self.api.param_serialize(
            "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        response = self.api.call_api(method, url, header_params=headers, _request_timeout=REQUEST_TIMEOUT)
        response.read()
        if response.status == 404:
            return None
        self.api.response_deserialize(response, {"2XX": "object"})  # raises the client's ApiException on errors
        return json.loads(response.data)

    def managed_fields(self, resource: dict[str, Any], namespace: Optional[str], name: str) -> Optional[list]:
        """The object's `metadata.managedFields`, or None if it does not exist (or its kind is not served)."""
        api_version, kind = api_version_kind(resource)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        listing = self._get(base) or {}
        served = next((r for r in listing.get("resources") or [] if r.get("kind") == kind and "/" not in r["name"]),
                      None)
        if served is None:
            return None
        scope = f"/namespaces/{namespace}" if served.get("namespaced") else ""
        found = self._get(f"{base}{scope}/{served['name']}/{name}")
        return None if found is None else (found.get("metadata") or {}).get("managedFields") or []

    def helm_records(self, namespace: str, name: str) -> list[HelmRecord]:
        secrets = self.core.list_namespaced_secret(namespace, label_selector=f"owner=helm,name={name}",
                                                   _request_timeout=REQUEST_TIMEOUT).items
        records = []
        for s in secrets:
            labels = s.metadata.labels or {}
            try:
                first = parse_time(decode_release((s.data or {})["release"])["info"]["first_deployed"])
            except (KeyError, ValueError, TypeError, OSError):
                first = None  # unreadable: treated as not provably this stack's
            records.append(HelmRecord(s.metadata.name, int(labels.get("version") or 0), labels.get("status") or "",
                                      first))
        return records

    def remove_records(self, namespace: str, secrets: tuple[str, ...]) -> None:
        for secret in secrets:
            self.core.delete_namespaced_secret(secret, namespace, _request_timeout=REQUEST_TIMEOUT)
