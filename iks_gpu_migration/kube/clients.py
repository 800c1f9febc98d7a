"""One Kubernetes API client per kubeconfig in the provider host process, shared by its threads for a short while.

Every dynamic resource of a stack runs in one provider host process, a batch's k nodes on k threads at once, and each
step used to build its own client (`config.new_client_from_config`: parse the kubeconfig, build an SSL context, open
a new TLS connection): several per node, about 6 ms of CPU each against the local API server, a TLS handshake across
the network against an IKS master. A shared client reuses its connections: urllib3's PoolManager is safe to share
between threads (urllib3 docs, "Using PoolManager"), and ApiClient keeps no per-request state our calls read.

A client is keyed by the kubeconfig files' names and modification times (`ibmcloud ks cluster config` rewrites the
file: the next call gets a client with its credentials) and by its use (requests, or watches: watch_client), and kept
at most `TTL` seconds. Clients that expire are left to the garbage collector, as a thread may still be using them.
A token from an exec plugin or a tokenFile is obtained again before it expires and after the API server refused it
(401), once for the whole process, and the refused request is sent once more with the new token (credentials.py); an
OIDC auth-provider's token is refreshed by the client library when it loads the kubeconfig, at least every TTL.

Every request has a timeout (bounded): a half-open connection (a load balancer that dropped its state, a stalled VPN)
would otherwise block a call for ever, as no call of this program passes `_request_timeout` and kubernetes'
RESTClientObject.request then hands urllib3 `timeout=None`, which urllib3 (connectionpool.py _get_timeout) reads as
"no timeout": a pool-wide default never applies. A call's own `_request_timeout` wins (watches: node_changes.py).
"""
import contextlib
import os
import threading
import time
from typing import Iterator, Optional

import urllib3
from kubernetes.client import ApiClient, Configuration

from . import credentials

TTL = 60.0
# Connect (TCP and TLS handshake) within client-go's TLS handshake timeout (10 s: k8s.io/apimachinery pkg/util/net
# SetOldTransportDefaults takes Go's http.DefaultTransport's); then each read of the answer within 70 s:
# kube-apiserver answers every request but a watch within its --request-timeout (default 60 s, a 504 after that).
CONNECT_TIMEOUT, READ_TIMEOUT = 10.0, 70.0
# urllib3's default, Retry(3) (util/retry.py), retries a GET's read timeout three times; here once, on a new
# connection (the case of a pooled connection gone half-open). So a server that never answers costs a call
# 2 x READ_TIMEOUT (plus connects), one that cannot be reached 4 x CONNECT_TIMEOUT, as refused connects are retried.
RETRIES = urllib3.Retry(3, read=1)
# urllib3 keeps this many connections per host (kubernetes' default: 5 per CPU); a batch's threads beyond it would
# open and drop connections, with a "Connection pool is full" warning each time.
POOL_SIZE = 128


def _files(kubeconfig: Optional[str]) -> tuple[tuple[str, int], ...]:
    """The files the client is loaded from (KUBECONFIG may list several) with their modification times."""
    names = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    out = []
    for name in names.split(os.pathsep):
        try:
            out.append((name, os.stat(name).st_mtime_ns))
        except OSError:
            out.append((name, 0))
    return tuple(out)


class _Clients:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple, tuple[float, ApiClient]] = {}

    def get(self, kubeconfig: Optional[str], purpose: str = "requests") -> ApiClient:
        key, now = (kubeconfig or "", _files(kubeconfig), purpose), time.monotonic()
        with self._lock:
            held = self._by_key.get(key)
            if held is not None and now - held[0] < TTL:
                return held[1]
            api = new_client(kubeconfig)
            # Expired entries (any kubeconfig) are dropped; their clients close when the last user lets go.
            self._by_key = {k: v for k, v in self._by_key.items() if now - v[0] < TTL}
            self._by_key[key] = (now, api)
            return api


def new_client(kubeconfig: Optional[str], retries: "urllib3.Retry | int" = RETRIES) -> ApiClient:
    """A client of its own for `kubeconfig` (None: KUBECONFIG or ~/.kube/config), bounded and with a renewable
    credential: what every Kubernetes client of the package is built with (the commands' too: cli/)."""
    configuration = Configuration()
    configuration.connection_pool_maxsize = POOL_SIZE
    configuration.retries = retries  # read when the client's connection pool is made, so before ApiClient()
    credential = credentials.load(kubeconfig, configuration)
    return bounded(ApiClient(configuration), credential)


def bounded(api: ApiClient, credential: Optional[credentials.Credential] = None) -> ApiClient:
    """`api` with (CONNECT_TIMEOUT, READ_TIMEOUT) for every request that sets no `_request_timeout` of its own: its
    RESTClientObject.request is the one place every call (ApiClient.call_api) goes through. With a `credential`, a
    request answered 401 is sent once more if the credential then has another token (client-go answers the caller
    with the 401 and renews for the next request; here the caller, often a wait, gets the answer of the retry)."""
    rest = api.rest_client

    def bounded_request(method, url, headers=None, *args, _request_timeout=None, **kwargs):
        # The class's request, looked up at each call (not bound once): what wraps the class later applies too.
        timeout = _request_timeout or (CONNECT_TIMEOUT, READ_TIMEOUT)
        response = type(rest).request(rest, method, url, headers, *args, _request_timeout=timeout, **kwargs)
        sent = (headers or {}).get("authorization") or ""
        if response.status == 401 and credential is not None and credential.refused(sent.removeprefix("Bearer ")):
            response.read()  # the refusal's short body: its connection goes back to the pool
            headers = {**headers, "authorization": f"Bearer {credential.token()}"}
            response = type(rest).request(rest, method, url, headers, *args, _request_timeout=timeout, **kwargs)
        return response

    rest.request = bounded_request
    return api


_CLIENTS = _Clients()


def shared_client(kubeconfig: Optional[str]) -> ApiClient:
    """The process's client for `kubeconfig` (None: KUBECONFIG or ~/.kube/config); never to be closed by its user."""
    return _CLIENTS.get(kubeconfig)


def watch_client(kubeconfig: Optional[str]) -> ApiClient:
    """shared_client's twin for watches (kube/node_changes.py): a watch holds its connection up to its timeout, one
    per waiting node, so a batch of 100 would take most of the requests' pool and leave its requests opening and
    dropping connections. Watches get a pool of their own."""
    return _CLIENTS.get(kubeconfig, "watches")


@contextlib.contextmanager
def api_client(kubeconfig: Optional[str]) -> Iterator[ApiClient]:
    """`with api_client(kubeconfig) as api:` in place of `with config.new_client_from_config(...) as api:`; the
    client is shared, so leaving the block does not close it."""
    yield shared_client(kubeconfig)
