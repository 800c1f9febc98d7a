"""Two costs of the Pulumi Python SDK (3.272) that grow faster than the fleet, and what this program does about them.
Measured with benchmarks/preview.py (real CLI, 100 vs 1000 device-plugin nodes); see README "Fleet scale"."""
import asyncio
import os
from typing import Any, Callable, Optional

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
