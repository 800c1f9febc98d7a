"""One Kubernetes API client per kubeconfig in the provider host process, shared by its threads for a short while.

Every dynamic resource of a stack runs in one provider host process, a batch's k nodes on k threads at once, and each
step used to build its own client (`config.new_client_from_config`: parse the kubeconfig, build an SSL context, open
a new TLS connection): several per node, about 6 ms of CPU each against the local API server, a TLS handshake across
the network against an IKS master. A shared client reuses its connections: urllib3's PoolManager is safe to share
between threads (urllib3 docs, "Using PoolManager"), and ApiClient keeps no per-request state our calls read.

A client is keyed by the kubeconfig files' names and modification times (`ibmcloud ks cluster config` rewrites the
file: the next call gets a client with its credentials) and by its use (requests, or watches: watch_client), and kept
at most `TTL` seconds. An expiring exec or OIDC token
is reloaded by the client itself before a request (kubernetes/config/kube_config.py, the `refresh_api_key_hook` it
sets). Clients that expire are left to the garbage collector, as a thread may still be using them.
"""
import contextlib
import os
import threading
import time
from typing import Iterator, Optional

from kubernetes import config
from kubernetes.client import ApiClient, Configuration

TTL = 60.0
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
            configuration = Configuration()
            configuration.connection_pool_maxsize = POOL_SIZE
            api = config.new_client_from_config(config_file=kubeconfig or None, client_configuration=configuration)
            # Expired entries (any kubeconfig) are dropped; their clients close when the last user lets go.
            self._by_key = {k: v for k, v in self._by_key.items() if now - v[0] < TTL}
            self._by_key[key] = (now, api)
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
