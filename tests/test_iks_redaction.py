"""No API key or token in an error, whatever IAM or IKS (or a proxy in front of them) answers: an echoing fake on
127.0.0.1 puts the request (form with `apikey=`, `Authorization: Bearer` header) into its error answers; the client's
errors, and the error and log `pulumi up` would show (the real dynamic provider host), mask them and keep IBM's
fields."""
import asyncio
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import grpc
import jwt
import pytest
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import proto, rpc
from pulumi.runtime.proto import provider_pb2_grpc

from gpu_migration_local.http_server import LocalServer
from iks_gpu_migration.iks.api import IksApiError, IksClient
from iks_gpu_migration.iks.master import MasterVersionProvider

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEY = "Zx9_k3yV4lue-0123456789abcdefghijKLMNOPQRSTU"  # shaped like an IBM Cloud API key (44 chars)


class Echo:
    """IAM and IKS fakes whose error answers repeat the request they got, as the proxy in the measurement did."""

    def __init__(self, iam: str = "ok", iks: str = "ok") -> None:
        self.iam, self.iks = iam, iks
        self.token = jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 3600, "sub": "ServiceId-1"},
                                "echo-signing-key-not-a-secret-0000", algorithm="HS256")
        self.server = LocalServer(self._handle)

    def _handle(self, method: str, path: str, headers, body: bytes) -> tuple[int, Any]:
        request = f"{method} {path}\n{headers}\n{body.decode()}"
        if path.startswith("/identity/token"):
            if self.iam == "text":
                return 400, f"Bad Request from proxy; your request was:\n{request}"
            if self.iam == "json":
                return 400, {"errorCode": "BXNIM0415E", "context": {"requestId": "req-7"},
                             "errorMessage": f"Provided API key could not be found: {body.decode()}"}
            if self.iam == "outage":
                return 503, f"upstream unavailable; request: {request}"
            return 200, {"access_token": self.token, "refresh_token": "OPAQUE-refresh-0123456789", "token_type":
                         "Bearer", "expires_in": 3600, "expiration": int(time.time()) + 3600}
        if self.iks == "json":
            return 403, {"code": "E3c4f", "incidentID": "inc-42",
                         "description": f"You are not authorized; request headers: {headers}"}
        if self.iks == "long":
            return 400, f"proxy error\n{request}\n" + "x" * 5000
        return 200, {"name": "c", "masterKubeVersion": "1.37.0_1501"}

    def __enter__(self) -> "Echo":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    def client(self) -> IksClient:
        return IksClient(self.server.url, self.server.url, KEY, max_retries=1, retry_interval=0.01)


def failure(echo: Echo) -> str:
    with pytest.raises(IksApiError) as failed:
        echo.client().get_cluster("c")
    return str(failed.value)


def assert_clean(text: str, echo: Echo) -> None:
    assert KEY not in text and echo.token not in text and "OPAQUE-refresh" not in text
    assert echo.token.split(".")[1] not in text  # no part of the JWT either


@pytest.mark.parametrize("mode", ["text", "json", "outage"])
def test_iam_answers_echoing_the_api_key_are_masked(mode):
    with Echo(iam=mode) as echo:
        message = failure(echo)
    assert_clean(message, echo)
    assert "[redacted]" in message
    if mode == "json":  # IAM's own fields stay
        assert "Provided API key could not be found" in message and "code BXNIM0415E" in message
        assert "request req-7" in message
    if mode == "outage":
        assert "after 4 attempts; this is IAM trouble, not a bad API key" in message


def test_iks_answers_echoing_the_bearer_token_are_masked_and_keep_ibms_fields():
    with Echo(iks="json") as echo:
        message = failure(echo)
    assert_clean(message, echo)
    assert "HTTP 403: You are not authorized" in message and "code E3c4f, incident inc-42" in message


def test_long_answers_are_cut_saying_how_much():
    with Echo(iks="long") as echo:
        message = failure(echo)
    assert_clean(message, echo)
    assert "more characters cut)" in message and len(message) < 900


def test_the_error_and_log_pulumi_shows_hold_no_key(tmp_path):
    """What `pulumi up` shows: the dynamic provider host (`python -m pulumi.dynamic`, as the engine starts it) sends
    the exception with its traceback as the gRPC error (pulumi/dynamic/__main__.py _abort_with_traceback), and its
    stderr is the engine's log of the plugin."""
    env = {k: v for k, v in os.environ.items() if k != "IC_API_KEY"}
    log = tmp_path / "host.log"
    with Echo(iam="json") as echo, log.open("w") as err:
        host = subprocess.Popen([sys.executable, "-m", "pulumi.dynamic"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            port = int(host.stdout.readline())
            stub = provider_pb2_grpc.ResourceProviderStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
            api = {"endpoint": echo.server.url, "iam_endpoint": echo.server.url, "api_key": KEY,
                   "max_retries": 1, "retry_interval": 0.01}
            props = {"cluster": "c", "version": "1.37", "api": api, "timeout": 5, "poll_interval": 0.01,
                     "__provider": serialize_provider(MasterVersionProvider())}
            with pytest.raises(grpc.RpcError) as failed:
                stub.Create(proto.CreateRequest(
                    urn="urn:pulumi:test::gpu-migration::pulumi-python:dynamic/gpu-migration:MasterVersion::master",
                    properties=asyncio.run(rpc.serialize_properties(props, {}))), timeout=30)
        finally:
            host.kill()
            host.wait()
    details = failed.value.details()
    assert "IAM token request" in details and "code BXNIM0415E" in details  # the real error reached the engine
    assert_clean(details, echo)
    assert_clean(log.read_text(), echo)
