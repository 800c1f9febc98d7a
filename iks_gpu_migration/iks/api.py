"""Small IBM Cloud Kubernetes Service (IKS, VPC) API client on ibm-cloud-sdk-core, plus helpers over its JSON.

Paths follow the IKS global API (https://containers.cloud.ibm.com/global/swagger-global-api):
  GET  /v2/vpc/getCluster, PUT /v1/clusters/{cluster} (master update),
  GET  /v2/vpc/getWorkers, GET /v2/vpc/getWorker, POST /v2/vpc/replaceWorker,
  POST /v2/vpc/createWorkerPool, GET /v2/vpc/getWorkerPool, DELETE /v1/clusters/{cluster}/workerpools/{pool}.
5xx/429 are retried by the SDK (BaseService.enable_retries); a 401 forces one IAM token refresh and one retry.
The IAM token request is not covered by the SDK's retries (its token manager calls `requests` directly and a connection
error surfaces from `prepare_request`), so connection errors and IAM 5xx/429 are retried here and reported as IAM
trouble; only IAM 4xx answers mean the API key itself was refused.
Every error text built from an API answer is redacted and clipped (redact.py): an answer may echo the request, key and
token included.
The IAM token is shared by the provider process's operations (shared_authenticator): a batch's replacements do not
each ask IAM for one. So is the client itself (IksClient.from_api): each new one builds its HTTP session's SSL
context twice (the SDK's SSLHTTPAdapter loads the CA bundle in BaseService.__init__ and again in enable_retries),
tens of ms of CPU that a batch's k replacements paid at once, and opens its own TLS connections to the API.
"""
import hashlib
import os
import threading
import time
from typing import Any, Iterable, Optional

import requests
from ibm_cloud_sdk_core import ApiException, BaseService
from ibm_cloud_sdk_core.authenticators import IAMAuthenticator

from .roles import OPERATOR, VIEWER, needs
from .redact import safe

API_KEY_ENV = "IC_API_KEY"
API_KEY_CONFIG = "gpu-migration:ibmApiKey"


# IKS error codes this client acts on (IBM-Cloud/bluemix-go and terraform-provider-ibm compare the same codes).
CLUSTER_NOT_FOUND = "G0004"  # "The specified cluster could not be found. ... target the correct account and RG"
MASTER_BUSY = "Ef9cc"  # "The master must be in the deployed state ..." (another master operation is running)
IAM_ATTEMPTS = 4
# Every IKS and IAM request: connect within 10 s, each read of the answer within 60 s (the SDK's own default, one
# number for both: ibm-cloud-sdk-core base_service.py send, token_managers/token_manager.py _request), set here so a
# half-open connection ends the call and the value is ours. The SDK's retries (enable_retries: read errors too, for
# every method) make a call that never gets an answer last up to (max_retries + 1) x 60 s plus its backoff.
HTTP_TIMEOUT = (10.0, 60.0)

# One IAM authenticator per IAM endpoint and API key in this process. Its token manager keeps the token (an hour) and
# fetches a new one near expiry, one caller at a time (ibm-cloud-sdk-core token_managers/token_manager.py get_token,
# paced_request_token), as the SDK intends an authenticator to be shared by a service's calls. A per-operation
# authenticator asked IAM for a token on every operation: ten at the start of each batch of ten, a 401 refreshed for
# one operation only, and IAM rate-limits token requests per key. Keyed by the key's digest, never the key.
_AUTHENTICATORS: dict[tuple[str, str], IAMAuthenticator] = {}
_AUTHENTICATORS_LOCK = threading.Lock()


def shared_authenticator(api_key: str, iam_endpoint: str) -> IAMAuthenticator:
    key = (iam_endpoint, hashlib.sha256(api_key.encode()).hexdigest())
    with _AUTHENTICATORS_LOCK:
        if key not in _AUTHENTICATORS:
            _AUTHENTICATORS[key] = IAMAuthenticator(api_key, url=iam_endpoint)
        return _AUTHENTICATORS[key]


class IksApiError(RuntimeError):
    """An IKS or IAM call failed; the message names the call, its subject and the API's own message."""

    def __init__(self, message: str, status_code: Optional[int] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code


class ClusterNotFound(IksApiError):
    """404 G0004: the cluster itself is not visible to this API key (never "the pool or worker is gone")."""


def error_code(error: ApiException) -> Optional[str]:
    try:
        body = error.http_response.json()
    except Exception:  # noqa: BLE001 - non-JSON error bodies carry no code
        return None
    return body.get("code") if isinstance(body, dict) else None


def api_message(error: ApiException, secrets: Iterable[str] = ()) -> str:
    """IBM's own fields of an error answer, redacted and clipped: IKS answers {"code", "description", "incidentID"},
    IAM {"errorCode", "errorMessage", "context": {"requestId"}}; anything else keeps the SDK's parse of the body
    (ibm_cloud_sdk_core api_exception.py _get_error_message: a message field, else the whole text)."""
    try:
        body = error.http_response.json()
    except Exception:  # noqa: BLE001 - non-JSON error bodies keep the SDK's message
        body = {}
    body = body if isinstance(body, dict) else {}
    context = body.get("context") if isinstance(body.get("context"), dict) else {}
    text = body.get("description") or body.get("errorMessage") or str(error.message)
    ids = ", ".join(f"{what} {value}" for what, value in (("code", body.get("code") or body.get("errorCode")),
                                                           ("incident", body.get("incidentID")),
                                                           ("request", context.get("requestId"))) if value)
    return safe(f"{text} ({ids})" if ids else str(text), secrets)


_CLIENTS: dict[tuple, "IksClient"] = {}
_CLIENTS_LOCK = threading.Lock()


class IksClient(BaseService):
    """One instance per API, key and retry settings in the provider process (from_api), shared by its threads: the
    session's connection pool is urllib3's, safe to share between threads (urllib3 docs, "Using PoolManager"), and a
    call keeps its state in its own prepared request. Never captured in pickled provider state."""

    def __init__(
        self,
        endpoint: str,
        iam_endpoint: str,
        api_key: str,
        max_retries: int = 4,
        retry_interval: float = 30.0,
    ) -> None:
        super().__init__(service_url=endpoint, authenticator=shared_authenticator(api_key, iam_endpoint))
        self.iam_endpoint = iam_endpoint
        self.retry_interval = retry_interval
        self.enable_retries(max_retries=max_retries, retry_interval=retry_interval)
        self.set_http_config({"timeout": HTTP_TIMEOUT})  # this client's requests and its (shared) IAM token's

    def _secrets(self) -> tuple[str, ...]:
        """What no error text may show: the API key and the tokens IAM issued for it."""
        manager = self.authenticator.token_manager
        return tuple(filter(None, (manager.apikey, manager.access_token, getattr(manager, "refresh_token", None))))

    def _safe(self, text: str) -> str:
        return safe(text, self._secrets())

    def _message(self, error: ApiException) -> str:
        return api_message(error, self._secrets())

    @classmethod
    def from_api(cls, api: dict[str, Any], fallback_key: Optional[str] = None) -> "IksClient":
        """`api` = {"endpoint", "iam_endpoint", "api_key" (None -> stack config / IC_API_KEY), optional retry knobs}."""
        key = api.get("api_key") or fallback_key or os.environ.get(API_KEY_ENV)
        if not key:
            raise IksApiError(
                f"no IBM Cloud API key: set the secret config {API_KEY_CONFIG} "
                f"(pulumi config set --secret {API_KEY_CONFIG} ...) or the {API_KEY_ENV} environment variable"
            )
        retries = (int(api.get("max_retries", 4)), float(api.get("retry_interval", 30.0)))
        shared = (cls, api["endpoint"], api["iam_endpoint"], hashlib.sha256(key.encode()).hexdigest(), retries)
        with _CLIENTS_LOCK:
            if shared not in _CLIENTS:
                _CLIENTS[shared] = cls(api["endpoint"], api["iam_endpoint"], key, max_retries=retries[0],
                                       retry_interval=retries[1])
            return _CLIENTS[shared]

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        params: Optional[dict] = None,
        body: Optional[dict] = None,
        not_found_ok: bool = False,
    ) -> Any:
        """Send one request; `what` (e.g. "replace worker w1 of cluster c") prefixes every error."""
        for attempt in (1, 2):
            request = self._prepare(what, method, path, params, body)
            try:
                return self.send(request).get_result()
            except ApiException as e:
                if e.status_code == 401 and attempt == 1:
                    self.authenticator.token_manager.expire_time = 0  # expired/revoked: fetch a fresh token once
                    continue
                code = error_code(e)
                if e.status_code == 404 and code == CLUSTER_NOT_FOUND:
                    cluster = (params or {}).get("cluster") or (body or {}).get("cluster") or path.split("/")[3]
                    raise ClusterNotFound(
                        f"{what} failed: cluster {cluster} was not found (HTTP 404: {self._message(e)}); check "
                        f"gpu-migration:clusterName, and that the API key belongs to the account and resource group "
                        f"of that cluster (`ibmcloud target`, `ibmcloud ks cluster ls`)", 404, code,
                    ) from None
                if e.status_code == 404 and not_found_ok:
                    return None
                raise IksApiError(f"{what} failed: HTTP {e.status_code}: {self._message(e)}", e.status_code,
                                  code) from None
            except requests.RequestException as e:  # connection errors, or retries of 5xx/429 exhausted
                raise IksApiError(f"{what} failed: {self._safe(str(e))}") from None
        raise AssertionError("unreachable")

    def _prepare(self, what: str, method: str, path: str, params: Optional[dict], body: Optional[dict]):
        """prepare_request fetches the IAM token when needed; IAM outages are retried, a refused key is not."""
        for attempt in range(1, IAM_ATTEMPTS + 1):
            try:
                return self.prepare_request(
                    method, path, params=params, data=body, headers={"Accept": "application/json"}
                )
            except ApiException as e:
                transient = e.status_code is not None and (e.status_code >= 500 or e.status_code == 429)
                if not transient:  # ibm-cloud-sdk-core api_exception.py: 4xx from IAM = the key was refused
                    raise IksApiError(
                        f"{what}: IAM token request to {self.iam_endpoint} failed (check the API key): "
                        f"HTTP {e.status_code}: {self._message(e)}", e.status_code,
                    ) from None
                problem = f"HTTP {e.status_code}: {self._message(e)}"
            except requests.RequestException as e:  # iam_request_based_token_manager.py: raised by `requests`
                problem = f"{type(e).__name__}: {self._safe(str(e))}"
            # token_manager.paced_request_token leaves request_time set when request_token raises, and would make
            # every caller sleep for 60 s "while another thread fetches"; the failed fetch was this one's, so the next
            # caller (this one retrying, or one waiting beside it) may fetch at once.
            self.authenticator.token_manager.request_time = 0
            if attempt == IAM_ATTEMPTS:
                raise IksApiError(
                    f"{what}: IBM Cloud IAM at {self.iam_endpoint} is unavailable ({problem}) after {attempt} "
                    f"attempts; this is IAM trouble, not a bad API key: check the network / IBM Cloud status and "
                    f"re-run `pulumi up`"
                ) from None
            time.sleep(self.retry_interval)
        raise AssertionError("unreachable")

    # Cluster master
    @needs(VIEWER)
    def get_cluster(self, cluster: str) -> dict:
        return self._call(f"get cluster {cluster}", "GET", "/v2/vpc/getCluster", params={"cluster": cluster})

    @needs(VIEWER)
    def kube_versions(self) -> set[str]:
        """Kubernetes major.minor versions IKS offers, e.g. {'1.35', '1.36'}."""
        offered = self._call("list Kubernetes versions", "GET", "/v1/versions") or {}
        return {f"{v['major']}.{v['minor']}" for v in offered.get("kubernetes") or []}

    @needs(OPERATOR)
    def update_master(self, cluster: str, version: str) -> None:
        (c,) = self.encode_path_vars(cluster)
        self._call(
            f"update master of cluster {cluster} to {version}", "PUT", f"/v1/clusters/{c}",
            body={"action": "update", "version": version},
        )

    # Workers
    @needs(VIEWER)
    def list_workers(self, cluster: str, pool: Optional[str] = None, show_deleted: bool = False) -> list[dict]:
        params = {"cluster": cluster, "pool": pool, "showDeleted": str(show_deleted).lower()}
        return self._call(f"list workers of cluster {cluster}", "GET", "/v2/vpc/getWorkers", params=params) or []

    @needs(VIEWER)
    def get_worker(self, cluster: str, worker_id: str) -> Optional[dict]:
        """None if the worker does not exist."""
        return self._call(
            f"get worker {worker_id} of cluster {cluster}", "GET", "/v2/vpc/getWorker",
            params={"cluster": cluster, "worker": worker_id}, not_found_ok=True,
        )

    @needs(OPERATOR)
    def replace_worker(self, cluster: str, worker_id: str) -> None:
        """Replace with update=true: the new worker (new ID) runs the master's major.minor version."""
        self._call(
            f"replace worker {worker_id} of cluster {cluster}", "POST", "/v2/vpc/replaceWorker",
            body={"cluster": cluster, "workerID": worker_id, "update": True},
        )

    # Worker pools
    @needs(OPERATOR)
    def create_worker_pool(
        self, cluster: str, name: str, flavor: str, vpc_id: str, zone: str, subnet_id: str, size_per_zone: int
    ) -> dict:
        body = {
            "cluster": cluster, "name": name, "flavor": flavor, "vpcID": vpc_id, "workerCount": size_per_zone,
            "zones": [{"id": zone, "subnetID": subnet_id}],
        }
        return self._call(
            f"create worker pool {name} in cluster {cluster}", "POST", "/v2/vpc/createWorkerPool", body=body
        ) or {}

    @needs(VIEWER)
    def get_worker_pool(self, cluster: str, pool: str) -> Optional[dict]:
        """None if the pool does not exist."""
        return self._call(
            f"get worker pool {pool} of cluster {cluster}", "GET", "/v2/vpc/getWorkerPool",
            params={"cluster": cluster, "workerpool": pool}, not_found_ok=True,
        )

    @needs(OPERATOR)
    def remove_worker_pool(self, cluster: str, pool: str) -> None:
        c, p = self.encode_path_vars(cluster, pool)
        self._call(
            f"remove worker pool {pool} from cluster {cluster}", "DELETE", f"/v1/clusters/{c}/workerpools/{p}",
            not_found_ok=True,
        )


# Helpers over the API's JSON.


