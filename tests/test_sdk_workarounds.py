"""The SDK workarounds of iks_gpu_migration/sdk_workarounds.py (their effect on time is in benchmarks/preview.py), and
the SDK internals they, state_compat.py, rollout.py and config/loading.py rely on: if an SDK upgrade changes one, a
test here fails and names it. The SDKs are installed at the lock's exact versions (requirements.txt)."""
import ast
import asyncio
import contextvars
import hashlib
import importlib.util
import importlib.metadata
import inspect
import json
import pathlib
import sys

import pulumi.log
import pulumi.runtime.config
import pytest

from iks_gpu_migration import sdk_workarounds
from iks_gpu_migration.components import hooks
from iks_gpu_migration.config import loading
from lockfile import REPO, pins, pinned_version


class Engine:
    def __init__(self) -> None:
        self.logged: list[str] = []

    def Log(self, req) -> None:  # noqa: N802 - the gRPC stub's method name
        self.logged.append(req.message)


def test_sdk_debug_messages_are_dropped_and_others_kept(monkeypatch):
    engine = Engine()
    monkeypatch.setattr(pulumi.log, "get_engine", lambda: engine)
    monkeypatch.delenv(sdk_workarounds.SDK_DEBUG_ENV, raising=False)
    try:
        sdk_workarounds.quiet_sdk_debug()
        pulumi.log.debug("beginning rpc register resource")
        pulumi.log.info("replacing worker w-1")
        assert engine.logged == ["replacing worker w-1"]
    finally:
        sdk_workarounds.restore_sdk_debug()
    pulumi.log.debug("after restore")
    assert engine.logged[-1] == "after restore"


def test_sdk_debug_is_kept_when_asked_for(monkeypatch):
    engine = Engine()
    monkeypatch.setattr(pulumi.log, "get_engine", lambda: engine)
    monkeypatch.setenv(sdk_workarounds.SDK_DEBUG_ENV, "1")
    try:
        sdk_workarounds.quiet_sdk_debug()
        pulumi.log.debug("beginning rpc register resource")
    finally:
        sdk_workarounds.restore_sdk_debug()
    assert engine.logged == ["beginning rpc register resource"]


def stack_traces_from_a_resource_constructor():
    """Both stack traces taken where the SDK takes them: inside Resource.__init__, under the CustomResource and the
    concrete class's constructors, called from `declare` (the program's frame the SDK names as source position)."""
    import pulumi.runtime.resource as sdk_resource

    class Resource:
        def __init__(self):
            self.traces = (sdk_workarounds._sdk_stack_trace or (sdk_resource._get_stack_trace,))[0](), \
                sdk_workarounds._one_frame_stack_trace()

    class CustomResource(Resource):
        def __init__(self):
            super().__init__()

    class NodeFence(CustomResource):
        def __init__(self):
            super().__init__()

    def declare():
        return NodeFence()

    return declare().traces, declare.__code__.co_firstlineno + 1


def test_resources_keep_their_source_position_and_no_stack_trace():
    import pulumi.runtime.resource as sdk_resource
    (full, one), line = stack_traces_from_a_resource_constructor()
    assert len(full.frames) > 3  # the SDK's: every frame down to the test runner
    assert list(one.frames) == list(full.frames[:1])
    sdk_position = (sdk_workarounds._sdk_stack_trace or (None, sdk_resource._get_source_position))[1](full)
    position = sdk_workarounds._position_of_frame(one)
    assert position == sdk_position and (position.line, position.uri) == (line, pathlib.Path(__file__).as_uri())
    assert len(one.frames) == 0  # what the registration then sends as its stack trace: nothing beside the position


def test_source_position_only_is_installed_unless_sdk_debugging(monkeypatch):
    import pulumi.runtime.resource as sdk_resource
    sdk = (sdk_resource._get_stack_trace, sdk_resource._get_source_position)
    monkeypatch.delenv(sdk_workarounds.SDK_DEBUG_ENV, raising=False)
    try:
        sdk_workarounds.source_position_only()
        assert sdk_resource._get_stack_trace is sdk_workarounds._one_frame_stack_trace
        assert sdk_resource._get_source_position is sdk_workarounds._position_of_frame
    finally:
        sdk_workarounds.restore_stack_traces()
    assert (sdk_resource._get_stack_trace, sdk_resource._get_source_position) == sdk
    monkeypatch.setenv(sdk_workarounds.SDK_DEBUG_ENV, "1")
    sdk_workarounds.source_position_only()
    assert sdk_resource._get_stack_trace is sdk[0]


def test_queued_registrations_start_before_the_sdk_waits():
    """After the entrypoint yields once, every task the program queued has started (the SDK's RPC list is filled)."""
    started: list[int] = []

    async def registration(i: int) -> None:
        started.append(i)
        await asyncio.sleep(1)

    async def program() -> list[int]:
        tasks = [asyncio.ensure_future(registration(i)) for i in range(100)]
        await sdk_workarounds._start_registrations()
        seen = list(started)
        for t in tasks:
            t.cancel()
        return seen

    assert asyncio.run(program()) == list(range(100))
    asyncio.set_event_loop(asyncio.new_event_loop())  # asyncio.run leaves none; Pulumi's mocks in later tests need one


# The SDK's private code each workaround relies on: (module, qualified name) -> (sha256 of its source in the pinned
# SDK (requirements.txt), what relies on it). A different hash means the SDK changed that code: re-read it, re-check
# the workaround (and benchmarks/preview.py), then update the hash here.
RELIED_ON = {
    ("pulumi.output", "Output.__init__"): ("13bd5242836b8fb6", "sdk_workarounds.edge_free builds Outputs without resources"),
    ("pulumi.runtime.stack", "wait_for_rpcs"): ("0bf483f44da06fc7", "sdk_workarounds.start_registrations_before_waiting"),
    ("pulumi.log", "_log"): ("4c35856b0f48b12f", "sdk_workarounds.quiet_sdk_debug (each message a blocking gRPC call)"),
    ("pulumi.runtime.resource", "_get_stack_trace"): ("c1f8beec3dad09fa", "sdk_workarounds.source_position_only takes its first frame, found the same way"),
    ("pulumi.runtime.resource", "_get_source_position"): ("dd45f49435f0b753", "sdk_workarounds.source_position_only: the position is the first frame's"),
    ("pulumi.runtime.resource", "register_resource"): ("094e3752d490c7e0", "sdk_workarounds.source_position_only: the position is taken right after the stack trace, which is sent after it"),
    ("pulumi.log", "debug"): ("766897f70e3a1770", "sdk_workarounds._dropped keeps its signature"),
    ("pulumi.runtime.resource_cycle_breaker", "_reachable"): ("0c1f86785ecdff23", "the O(n) cycle check edge-free Outputs avoid"),
    ("pulumi.dynamic.dynamic", "serialize_provider"): ("8d5613fceef2f9b0", "state_compat: providers pickled by module and class"),
    ("pulumi.dynamic.__main__", "get_provider"): ("36a42d0f6be3200c", "state_compat: the provider host unpickles them by import"),
    ("pulumi.dynamic.__main__", "main"): ("77f501f1bcbf5341", "sdk_workarounds.widen_provider_host (one grpc.server, ThreadPoolExecutor(max_workers=4))"),
    ("pulumi.runtime.config", "set_all_config"): ("dc0d5c55e5193650", "config/loading.py reads the stack's config from runtime.config.CONFIG"),
    ("pulumi.runtime.config", "get_config_env"): ("510dadb1abf6e33e", "config/loading.py reads PULUMI_CONFIG of older language hosts"),
}


def source_of(module: str, qualname: str) -> str:
    """Read from the module's file, not imported: pulumi.dynamic.__main__ starts the provider host when imported."""
    path = importlib.util.find_spec(module).origin
    tree = ast.parse(pathlib.Path(path).read_text())
    node: ast.AST = tree
    for part in qualname.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part)
    return ast.get_source_segment(pathlib.Path(path).read_text(), node)


def fingerprint(module: str, qualname: str) -> str:
    return hashlib.sha256(source_of(module, qualname).encode()).hexdigest()[:16]


# Packages whose internals or plugins the program relies on: sdk_workarounds.py, state_compat.py, rollout.py and
# config/loading.py (pulumi); tools/versions registers the Kubernetes provider plugin pulumi_kubernetes requests;
# hooks.SCRUBBED relies on how the pulumi-command plugin pulumi_command requests runs a command.
RELIED_ON_PACKAGES = ["pulumi", "pulumi-kubernetes", "pulumi-command"]


@pytest.mark.parametrize("package", RELIED_ON_PACKAGES)
def test_installed_at_the_locked_version(package):
    locked = pins(REPO / "requirements.txt")
    assert package in locked, f"requirements.txt must lock {package} (its internals are relied on)"
    assert importlib.metadata.version(package) == pinned_version(locked[package]), \
        f"{package} {importlib.metadata.version(package)} is installed, the lock says {locked[package].spec}: " \
        f"install the lock (docs/testing.md)"


def test_the_workarounds_name_the_versions_they_were_checked_against():
    locked = pins(REPO / "requirements.txt")
    assert f"pulumi (Python SDK) {pinned_version(locked['pulumi'])}" in inspect.getsource(sdk_workarounds)
    import pulumi_command
    plugin = json.loads((pathlib.Path(pulumi_command.__file__).parent / "pulumi-plugin.json").read_text())
    assert plugin["version"] == hooks.CHECKED_PLUGIN, "re-check hooks.SCRUBBED against this pulumi-command's run()"


def test_config_is_read_where_the_language_host_puts_it(monkeypatch):
    """config/loading.py reads runtime.config.CONFIG (set_all_config) and, for older hosts, PULUMI_CONFIG."""
    assert isinstance(pulumi.runtime.config.CONFIG, contextvars.ContextVar)
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({"gpu-migration:clusterName": "from-env"}))
    pulumi.runtime.set_all_config({"gpu-migration:kubeVersion": "1.37", "gpu-migration:nodes": "[]",
                                   "gpu-migration:ibmApiKey": "k", "other:key": "x"})
    try:
        assert loading.raw_from_pulumi() == {"clusterName": "from-env", "kubeVersion": "1.37", "nodes": []}
    finally:
        pulumi.runtime.set_all_config({})


def test_sdk_internals_relied_on_are_unchanged():
    changed = [f"{m}.{q} ({why})" for (m, q), (sha, why) in RELIED_ON.items() if fingerprint(m, q) != sha]
    assert not changed, "the Pulumi SDK changed code this program relies on; re-check: " + "; ".join(changed)


def test_edge_free_output_signature_and_provider_host_threads():
    params = list(inspect.signature(pulumi.Output.__init__).parameters)
    assert params == ["self", "resources", "future", "is_known", "is_secret"]
    assert list(inspect.signature(pulumi.log.debug).parameters) == list(inspect.signature(sdk_workarounds._dropped).parameters)
    host_main = source_of("pulumi.dynamic.__main__", "main")
    assert "grpc.server(" in host_main and "futures.ThreadPoolExecutor(max_workers=4)" in host_main
    assert source_of("concurrent.futures.thread", "ThreadPoolExecutor._adjust_thread_count").count(
        "self._max_workers") == 1  # read at each submit: raising it later lets more threads start


def serve_in_a_fake_host(monkeypatch, host: bool):
    """A gRPC server built as the dynamic-provider host builds it, in a process whose __main__ is (or is not) the
    host's module; then whatever widen_provider_host does."""
    import concurrent.futures
    import types

    import grpc
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    server = grpc.server(pool)
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.util.spec_from_loader(
        sdk_workarounds.PROVIDER_HOST_MODULE if host else "pytest.__main__", loader=None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    return pool, server, sdk_workarounds.widen_provider_host()


def test_the_provider_host_serves_more_than_four_operations_at_once(monkeypatch):
    import threading
    pool, server, widened = serve_in_a_fake_host(monkeypatch, host=True)
    try:
        assert widened >= 1 and pool._max_workers == sdk_workarounds.PROVIDER_HOST_WORKERS
        together = threading.Barrier(12, timeout=10)  # 12 waits that each hold a thread: only all at once pass
        assert all(f.result(timeout=20) is not None for f in [pool.submit(together.wait) for _ in range(12)])
    finally:
        server.stop(0)
        pool.shutdown(wait=False)


def test_outside_the_provider_host_nothing_is_widened(monkeypatch):
    pool, server, widened = serve_in_a_fake_host(monkeypatch, host=False)
    try:
        assert (widened, pool._max_workers) == (0, 4)
    finally:
        server.stop(0)
        pool.shutdown(wait=False)


def test_the_provider_host_logs_through_the_engine_and_a_waits_progress_is_ephemeral(monkeypatch, capsys):
    """4.: in the dynamic-provider host `pulumi.log` reaches the engine's Log service at the address in argv[1] (a real
    gRPC server here), the progress of a wait marked ephemeral; an engine that is gone costs a line on stderr, never
    the wait. Outside the host nothing changes."""
    from concurrent import futures
    from types import SimpleNamespace

    import grpc
    from pulumi.runtime.proto import engine_pb2_grpc

    from iks_gpu_migration.common import waiting

    received = []

    class Servicer(engine_pb2_grpc.EngineServicer):
        def Log(self, request, context):  # noqa: N802
            received.append((request.message, request.ephemeral))
            from google.protobuf import empty_pb2
            return empty_pb2.Empty()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    engine_pb2_grpc.add_EngineServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setattr(pulumi.log, "get_engine", pulumi.log.get_engine)  # restored afterwards
    assert sdk_workarounds.connect_provider_host_log() is False  # not the host: untouched
    host = SimpleNamespace(__spec__=SimpleNamespace(name=sdk_workarounds.PROVIDER_HOST_MODULE))
    monkeypatch.setitem(sys.modules, "__main__", host)
    monkeypatch.setattr(sys, "argv", ["pulumi.dynamic", f"127.0.0.1:{port}"])
    try:
        assert sdk_workarounds.connect_provider_host_log() is True
        waiting.progress("waiting for worker w-1: provisioning (3s of 5400s)")
        pulumi.log.info("worker w-1 is replaced by w-2")
        pulumi.log.warn("pool gpu has autoscaling on")
        assert received == [("waiting for worker w-1: provisioning (3s of 5400s)", True),
                            ("worker w-1 is replaced by w-2", True), ("pool gpu has autoscaling on", False)]
    finally:
        server.stop(0)
    pulumi.log.info("the engine is gone")  # no exception
    assert "the engine is gone" in capsys.readouterr().err
