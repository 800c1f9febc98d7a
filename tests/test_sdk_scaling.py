"""The SDK workarounds of iks_gpu_migration/sdk_scaling.py (their effect on time is in benchmarks/preview.py)."""
import asyncio

import pulumi.log

from iks_gpu_migration import sdk_workarounds as sdk_scaling


class Engine:
    def __init__(self) -> None:
        self.logged: list[str] = []

    def Log(self, req) -> None:  # noqa: N802 - the gRPC stub's method name
        self.logged.append(req.message)


def test_sdk_debug_messages_are_dropped_and_others_kept(monkeypatch):
    engine = Engine()
    monkeypatch.setattr(pulumi.log, "get_engine", lambda: engine)
    monkeypatch.delenv(sdk_scaling.SDK_DEBUG_ENV, raising=False)
    try:
        sdk_scaling.quiet_sdk_debug()
        pulumi.log.debug("beginning rpc register resource")
        pulumi.log.info("replacing worker w-1")
        assert engine.logged == ["replacing worker w-1"]
    finally:
        sdk_scaling.restore_sdk_debug()
    pulumi.log.debug("after restore")
    assert engine.logged[-1] == "after restore"


def test_sdk_debug_is_kept_when_asked_for(monkeypatch):
    engine = Engine()
    monkeypatch.setattr(pulumi.log, "get_engine", lambda: engine)
    monkeypatch.setenv(sdk_scaling.SDK_DEBUG_ENV, "1")
    try:
        sdk_scaling.quiet_sdk_debug()
        pulumi.log.debug("beginning rpc register resource")
    finally:
        sdk_scaling.restore_sdk_debug()
    assert engine.logged == ["beginning rpc register resource"]


def test_queued_registrations_start_before_the_sdk_waits():
    """After the entrypoint yields once, every task the program queued has started (the SDK's RPC list is filled)."""
    started: list[int] = []

    async def registration(i: int) -> None:
        started.append(i)
        await asyncio.sleep(1)

    async def program() -> list[int]:
        tasks = [asyncio.ensure_future(registration(i)) for i in range(100)]
        await sdk_scaling._start_registrations()
        seen = list(started)
        for t in tasks:
            t.cancel()
        return seen

    assert asyncio.run(program()) == list(range(100))
