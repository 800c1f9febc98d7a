"""Where this program works around the Pulumi Python SDK, all in one place. Each relies on SDK internals, so the SDK is
pinned exactly (requirements.txt) and tests/test_sdk_workarounds.py fails when one of them changes.

Checked against: pulumi (Python SDK) 3.272.0, under the Pulumi CLI/engine v3.274.0 (tools/versions).

1. Two costs that grow faster than the fleet (measured with benchmarks/preview.py, real CLI, 100 vs 1000 nodes;
   docs/fleet-scale.md):
   - `wait_for_rpcs` (pulumi/runtime/stack.py) re-waits on every pending Output for each engine answer when the
     program never awaited: fixed by `start_registrations_before_waiting`;
   - every `pulumi.log.debug` is a blocking gRPC call on the event loop (pulumi/log.py `_log`): `quiet_sdk_debug`.
2. Dependency edges that cost O(n) each: the SDK checks every new dependency for cycles by walking all transitive
   dependencies recursively (pulumi/runtime/resource_cycle_breaker.py `_reachable`, called from runtime/rpc.py
   `_add_dependency` for depends_on and for every resource an input Output carries). What every node waits for (the
   GPU Operator, the previous batch) therefore goes as an edge-free Output (`edge_free`, `once_done`):
   built with the SDK's private `Output.__init__(resources, future, is_known, is_secret)`.
   - every registration captures the whole Python stack, reading each frame's source line (`traceback.extract_stack`
     in pulumi/runtime/resource.py `_get_stack_trace`), and the state keeps it: about 20 frames, 2.5 KB of each
     resource's 4 KB. `source_position_only` takes the frame the SDK names as the resource's source position,
     found by walking frames, not by formatting them, and sends that position without a stack trace.
3. The dynamic-provider host serves every gpu-migration:* resource of a stack from one gRPC server whose thread pool
   has 4 workers (pulumi/dynamic/__main__.py `main`), and each replacement, drain or check holds its thread while it
   waits: 4 nodes of a batch progressed at once, whatever the budget. `widen_provider_host` lifts the pool in the
   host process, so the engine's `--parallel` is the only bound.
4. The dynamic-provider host never connects to the engine (pulumi/dynamic/__main__.py `get_provider` configures
   Settings without one), so `pulumi.log.*` there prints `info: ...` to stderr, which the CLI shows as a plain
   message and again under its closing Diagnostics, whatever `ephemeral` says, and lines written by two threads at
   once can run together. `connect_provider_host_log` points `pulumi.log` at the engine's Log service (the address
   the engine passes every resource plugin as its first argument: pulumi/pulumi
   sdk/go/common/resource/plugin/provider_plugin.go): one message per request, and every info of a provider (a
   wait's progress, what a step did) ephemeral: shown while it happens, not repeated in the closing Diagnostics
   (pkg/backend/display/progress.go skips ephemeral payloads there), which keep the warnings and errors; what the
   steps established is in the stack outputs the CLI prints last.
"""
import asyncio
import gc
import os
import pathlib
import sys
from typing import Any, Awaitable, Callable, Optional, Sequence

import pulumi
import pulumi.log

SDK_DEBUG_ENV = "GPU_MIGRATION_SDK_DEBUG"
_sdk_debug: Optional[Callable[..., Any]] = None


async def _start_registrations() -> None:
    """Yield to the event loop once so every RegisterResource RPC the program queued starts before the SDK waits for
    them. `wait_for_rpcs` (pulumi/runtime/stack.py) drains its RPC list only if that list is non-empty when the
    program returns; a program that never awaited leaves it empty, so the SDK instead loops `asyncio.wait(every
    pending output, FIRST_COMPLETED)` while the engine answers one resource at a time: O(outputs) per answer,
    quadratic in the fleet (45% of the program's CPU at 300 nodes)."""
    await asyncio.sleep(0)


def start_registrations_before_waiting() -> None:
    """Register `_start_registrations` as the program's async entrypoint (`pulumi.run`, awaited after `main`)."""
    pulumi.run(_start_registrations)


def quiet_sdk_debug() -> None:
    """Drop the SDK's own debug messages unless GPU_MIGRATION_SDK_DEBUG=1. `pulumi.log.debug` sends each one to the
    engine as a blocking gRPC call on the event loop (pulumi/log.py `_log`), several per resource ("beginning rpc
    register resource", ...), whether or not the CLI shows debug output (`pulumi up --debug`); that round trip slows
    as the engine gets busier, so it cost a 1000-node preview about a third of its wall time. This program's own
    messages use info/warn and are unaffected."""
    global _sdk_debug
    if os.environ.get(SDK_DEBUG_ENV) == "1" or _sdk_debug is not None:
        return
    _sdk_debug = pulumi.log.debug
    pulumi.log.debug = _dropped


def restore_sdk_debug() -> None:
    global _sdk_debug
    if _sdk_debug is not None:
        pulumi.log.debug, _sdk_debug = _sdk_debug, None


def _dropped(msg: str, resource: Any = None, stream_id: Optional[int] = None, ephemeral: Optional[bool] = None) -> None:
    """`pulumi.log.debug`'s signature; sends nothing."""


_sdk_stack_trace: Optional[tuple[Callable[..., Any], Callable[..., Any]]] = None


def source_position_only() -> None:
    """Register resources with their source position and no stack trace (2. above), unless GPU_MIGRATION_SDK_DEBUG=1.
    `sourcePosition` in the state is the same as with the SDK's stack trace, whose first frame it is."""
    import pulumi.runtime.resource as sdk_resource  # noqa: PLC0415

    if os.environ.get(SDK_DEBUG_ENV) == "1" or sdk_resource._get_stack_trace is _one_frame_stack_trace:
        return
    global _sdk_stack_trace
    _sdk_stack_trace = (sdk_resource._get_stack_trace, sdk_resource._get_source_position)
    sdk_resource._get_stack_trace, sdk_resource._get_source_position = _one_frame_stack_trace, _position_of_frame


def restore_stack_traces() -> None:
    global _sdk_stack_trace
    if _sdk_stack_trace is not None:
        import pulumi.runtime.resource as sdk_resource  # noqa: PLC0415

        (sdk_resource._get_stack_trace, sdk_resource._get_source_position), _sdk_stack_trace = _sdk_stack_trace, None


def _position_of_frame(stack: Any) -> Any:
    """`_get_source_position`'s answer (the first frame's position), taken out of `stack`: the SDK sends both with
    the registration (pulumi/runtime/resource.py register_resource), and the engine stores a stack trace beside the
    position even when it is just that frame (about 100 bytes of every resource in every state save)."""
    from pulumi.runtime.proto import source_pb2  # noqa: PLC0415

    if len(stack.frames) < 1:
        return None
    position = source_pb2.SourcePosition()
    position.CopyFrom(stack.frames[0].pc)
    del stack.frames[:]
    return position


def _one_frame_stack_trace() -> Any:
    """The first frame of `_get_stack_trace`'s answer, the same way found: the caller of the third `__init__` up the
    stack (Resource <- CustomResource/ComponentResource <- the concrete resource class)."""
    from pulumi.runtime.proto import source_pb2  # noqa: PLC0415

    frame, inits = sys._getframe(1), 0
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            inits += 1
            if inits == 3:
                break
        frame = frame.f_back
    caller = frame.f_back if frame is not None else None
    if caller is None or not caller.f_code.co_filename:
        return source_pb2.StackTrace()
    try:
        uri = pathlib.Path(caller.f_code.co_filename).as_uri()
    except ValueError:  # a relative path: the SDK skips such a frame's position
        return source_pb2.StackTrace(frames=[source_pb2.StackFrame()])
    position = source_pb2.SourcePosition(uri=uri, line=caller.f_lineno)
    return source_pb2.StackTrace(frames=[source_pb2.StackFrame(pc=position)])


def _resolved(value: bool) -> asyncio.Future:
    future = asyncio.get_event_loop().create_future()  # a future, not a coroutine: never "never awaited"
    future.set_result(value)
    return future


def edge_free(value: Awaitable[Any]) -> pulumi.Output:
    """An Output whose value is `value`'s result and which carries no resources (2. above): `Output.__init__`
    (resources, future, is_known, is_secret) is the SDK's own constructor, not public API."""
    return pulumi.Output(set(), asyncio.ensure_future(value), is_known=_resolved(True), is_secret=_resolved(False))


def once_done(value: Any, resources: Sequence[pulumi.Resource]) -> pulumi.Output:
    """`value`, resolved only once every resource in `resources` is registered (in `up`: its step finished), carrying
    none of them. For what every node waits for (the GPU Operator, which depends on every node's fence): a real edge
    makes the SDK's cycle check walk the operator's n fences for each node, O(n^2) (2. above)."""
    async def wait() -> Any:
        for resource in resources:
            await resource.urn.future()
        return value

    return edge_free(wait())


# The dynamic-provider host runs as `python -m pulumi.dynamic` (the CLI's pulumi-resource-pulumi-python script).
PROVIDER_HOST_MODULE = "pulumi.dynamic.__main__"
# Threads start only on demand (concurrent.futures.thread `_adjust_thread_count` reads `_max_workers` at each
# submit), so this is a ceiling, not a cost: the engine runs at most `--parallel` steps at once.
PROVIDER_HOST_WORKERS = 1024


def widen_provider_host(workers: int = PROVIDER_HOST_WORKERS) -> int:
    """In the dynamic-provider host (3. above), raise its gRPC server's thread pool to `workers`; elsewhere (the
    program, tests) do nothing. Returns how many server pools were widened. The server is a local of the host's
    `main`, so it is found as the one `grpc._server._ServerState` (its `thread_pool`) alive in the process; runs
    when the host first unpickles one of this package's providers (iks_gpu_migration/__init__.py)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) != PROVIDER_HOST_MODULE:
        return 0
    import grpc._server  # noqa: PLC0415 - only in the host

    widened = 0
    for state in [o for o in gc.get_objects() if isinstance(o, grpc._server._ServerState)]:
        pool = state.thread_pool
        if pool._max_workers < workers:
            pool._max_workers = workers
            widened += 1
    return widened



class _HostEngineLog:
    """The engine's Log service for the provider host; a message the engine can't take (it is gone, e.g. killed) goes
    to stderr as the SDK would print it, so logging never fails a wait."""

    def __init__(self, address: str):
        import grpc  # noqa: PLC0415 - only in the host
        from pulumi.runtime.proto import engine_pb2_grpc  # noqa: PLC0415
        self._stub = engine_pb2_grpc.EngineStub(grpc.insecure_channel(address))

    def Log(self, request: Any) -> None:  # noqa: N802 - the engine service's method name
        from pulumi.runtime.proto import engine_pb2  # noqa: PLC0415
        if request.severity == engine_pb2.INFO:
            # A provider's info is the narration of its step: shown once, as it happens. What it established is in
            # the stack outputs (the CLI's closing summary); warnings and errors stay in the closing Diagnostics.
            request.ephemeral = True
        try:
            self._stub.Log(request, timeout=10)
        except Exception:  # noqa: BLE001
            print(f"{request.message}", file=sys.stderr, flush=True)


def connect_provider_host_log() -> bool:
    """In the dynamic-provider host (4. above), send `pulumi.log.*` to the engine, whose address the engine passes as
    the plugin's first argument; elsewhere do nothing. Returns whether it connected."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) != PROVIDER_HOST_MODULE or len(sys.argv) < 2:
        return False
    engine = _HostEngineLog(sys.argv[1])
    pulumi.log.get_engine = lambda: engine  # pulumi/log.py looks it up on every message
    return True
