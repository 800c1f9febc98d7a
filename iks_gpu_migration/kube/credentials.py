"""Kubernetes credentials that expire during a run: a kubeconfig's exec plugin (client.authentication.k8s.io/v1 or
v1beta1, what `ibmcloud ks cluster config` writes for IAM users) or its `tokenFile`, obtained again when the token is
about to expire or the API server refuses it (401), as client-go does.

kubernetes' Python client runs an exec plugin when it loads the kubeconfig and again before a request once the
plugin's `expirationTimestamp` is near (config/kube_config.py `_set_config`, its refresh_api_key_hook), but:
- a token refused before its stated expiry (revoked, rotated, or a plugin that states none) is sent again and again;
  client-go runs the plugin again after a 401 (plugin/pkg/client/auth/exec/exec.go: roundTripper.RoundTrip ->
  maybeRefreshCreds, once per refused credential however many requests saw it);
- a failing plugin is only logged and the old token kept (kube_config.py `_load_from_exec_plugin` catches everything);
- the plugin may run for ever (config/exec_provider.py: `communicate()` with no timeout), once per thread that finds
  the token expired;
- a `tokenFile` is read once; client-go reads it again every minute (transport/token_source.go
  NewCachedFileTokenSource).
So one `Credential` per plugin (or token file) in the process, shared by every client built from it: one run serves
every thread, a run is bounded by EXEC_TIMEOUT and fails with the plugin's own words, and kube/clients.py sends a
refused request once more with the new token.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from typing import Any, Callable, Optional

from kubernetes.config.config_exception import ConfigException
from kubernetes.config.dateutil import parse_rfc3339
from kubernetes.config.exec_provider import ExecProvider
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

EXEC_TIMEOUT = 60.0  # seconds a plugin may take to hand out a token (it may itself call IAM, with its own retries)
EARLY = 60.0  # a token is obtained again this long before its stated expiry (at most half its lifetime)
FILE_PERIOD = 60.0  # a token file is read again after this long (client-go's period)


class CredentialError(ConfigException):
    """The kubeconfig's credential could not be obtained; the message names the plugin or file and why."""


class _ClientCertificate(Exception):
    """The plugin hands out a client certificate, not a token: left to the client library."""


class Credential:
    """A bearer token that can be obtained again: `fetch()` returns the token and its expiry (epoch seconds) or None."""

    def __init__(self, what: str, fetch: Callable[[], tuple[str, Optional[float]]]) -> None:
        self.what, self._fetch = what, fetch
        self._lock = threading.Lock()
        self._token: Optional[str] = None
        self._renew_at: Optional[float] = None
        self.fetches = 0

    def token(self) -> str:
        """The current token, obtained again first if it is (about to be) expired."""
        with self._lock:
            if self._token is None or (self._renew_at is not None and time.time() >= self._renew_at):
                self._renew()
            return self._token

    def refused(self, token: str) -> bool:
        """The API server answered 401 to `token`: obtain a new one unless another thread already did. True if there
        is now a different token to send."""
        with self._lock:
            if token == self._token:
                self._renew()
            return self._token != token

    def _renew(self) -> None:
        token, expiry = self._fetch()
        self.fetches += 1
        now = time.time()
        self._token = token
        self._renew_at = None if expiry is None else expiry - min(EARLY, max(0.0, (expiry - now) / 2))


_SHARED: dict[str, Credential] = {}
_SHARED_LOCK = threading.Lock()


def _shared(key: Any, make: Callable[[], Credential]) -> Credential:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    with _SHARED_LOCK:
        if digest not in _SHARED:
            _SHARED[digest] = make()
        return _SHARED[digest]


def _run_plugin(provider: ExecProvider, what: str) -> tuple[str, Optional[float]]:
    """One run of an exec plugin, as client-go runs it non-interactively (KUBERNETES_EXEC_INFO, no stdin)."""
    info: dict[str, Any] = {"apiVersion": provider.api_version, "kind": "ExecCredential",
                            "spec": {"interactive": False}}
    if provider.cluster is not None:  # provideClusterInfo
        info["spec"]["cluster"] = _cluster_info(provider)
    env = {**provider.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
    try:
        done = subprocess.run(provider.args, cwd=provider.cwd, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=EXEC_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise CredentialError(f"{what} gave no credential within {EXEC_TIMEOUT:g} s (it was stopped)") from None
    except OSError as e:
        raise CredentialError(f"{what} could not be run: {e}") from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[-400:] or "nothing on stderr"
        raise CredentialError(f"{what} failed with exit code {done.returncode}: {said}")
    try:
        data = json.loads(done.stdout)
        status = data["status"]
    except (ValueError, KeyError, TypeError):
        raise CredentialError(f"{what} printed no ExecCredential with a status") from None
    if data.get("apiVersion") != provider.api_version:
        raise CredentialError(f"{what} answered apiVersion {data.get('apiVersion')!r}, the kubeconfig asks for "
                              f"{provider.api_version!r}")
    if not status.get("token"):
        if status.get("clientCertificateData"):
            raise _ClientCertificate()
        raise CredentialError(f"{what} returned no token")
    expiry = status.get("expirationTimestamp")
    return status["token"], parse_rfc3339(expiry).timestamp() if expiry else None


def _read_token_file(path: str) -> tuple[str, Optional[float]]:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise CredentialError(f"the kubeconfig's tokenFile {path} could not be read: {e}") from None
    if not token:
        raise CredentialError(f"the kubeconfig's tokenFile {path} is empty")
    return token, time.time() + FILE_PERIOD


class _Loader(KubeConfigLoader):
    """The client library's loader, with exec plugins and token files served by a shared Credential."""

    credential: Optional[Credential] = None

    def _load_user_token(self):
        if self._user.safe_get("token") or not self._user.safe_get("tokenFile"):
            return super()._load_user_token()
        path = os.path.join(self._get_base_path(self._user.path), self._user["tokenFile"])
        self.credential = _shared(("tokenFile", path), lambda: Credential(path, lambda: _read_token_file(path)))
        self.token = f"Bearer {self.credential.token()}"
        return True

    def _load_from_exec_plugin(self):
        if "exec" not in self._user:
            return None
        provider = ExecProvider(self._user["exec"], self._get_base_path(self._cluster.path),
                                self._cluster if self._user["exec"].safe_get("provideClusterInfo") else None)
        if self._user["exec"].safe_get("interactiveMode") == "Always":
            raise CredentialError(f"the kubeconfig's exec plugin {provider.args[0]} needs a terminal "
                                  f"(interactiveMode: Always), which no `pulumi up` step has")
        what = f"the kubeconfig's exec plugin {provider.args[0]}"
        key = ("exec", provider.args, provider.cwd, self._user["exec"].safe_get("env"), _cluster_info(provider))
        credential = _shared(key, lambda: Credential(what, lambda: _run_plugin(provider, what)))
        try:
            self.token = f"Bearer {credential.token()}"
        except _ClientCertificate:
            return super()._load_from_exec_plugin()  # a certificate: the library's own handling, renewed at TTL
        self.credential = credential
        return True


def _cluster_info(provider: ExecProvider) -> Optional[dict]:
    return None if provider.cluster is None else dict(provider.cluster.value)


def load(kubeconfig: Optional[str], configuration) -> Optional[Credential]:
    """config.load_kube_config(kubeconfig, client_configuration=configuration) with a renewable credential: returns
    it (None: the kubeconfig's user has neither exec plugin nor tokenFile) and sets the configuration's token from
    it before every request."""
    paths = os.fspath(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG") or "~/.kube/config"
    merged = KubeConfigMerger(paths)  # several files (os.pathsep), each path expanded: as load_kube_config reads them
    if merged.config is None:
        raise ConfigException("Invalid kube-config file. No configuration found.")
    loader = _Loader(config_dict=merged.config, config_base_path=None, config_persister=merged.save_changes)
    loader.load_and_set(configuration)
    credential = loader.credential
    if credential is not None:
        def current_token(conf) -> None:
            conf.api_key["BearerToken"] = f"Bearer {credential.token()}"

        configuration.refresh_api_key_hook = current_token  # in place of the library's (see the docstring)
    return credential
