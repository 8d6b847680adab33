"""SubscribeRuntimeEvents: type filtering and argument validation."""

from __future__ import annotations

import asyncio

import grpc

from conformance.registry import Skip, check, expect
from openengine_adapters.v1 import observability_pb2 as O

C = grpc.StatusCode
TYPES = [t for t in O.RuntimeEventType.values() if t != 0]


async def _collect(ctx, types: list[int], seconds: float = 1.5) -> list:
    call = ctx.stub.SubscribeRuntimeEvents(O.SubscribeRuntimeEventsRequest(types=types), timeout=60)
    out = []

    async def reader():
        async for r in call:
            out.append(r)
            if r.WhichOneof("event") == "error":
                break

    task = asyncio.ensure_future(reader())
    try:
        await asyncio.sleep(0.3)
        if task.done() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == C.UNIMPLEMENTED:
                raise Skip("SubscribeRuntimeEvents is UNIMPLEMENTED")
            raise exc
        if ctx.can_send_traffic():
            await ctx.generate(ctx.request("rt", max_tokens=4))
        await asyncio.sleep(seconds)
    finally:
        call.cancel()
        try:
            await task
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
    return out


@check("runtime.reject_unspecified_type", "always (UNIMPLEMENTED accepted)")
async def unspecified(ctx):
    """Subscribing with RUNTIME_EVENT_TYPE_UNSPECIFIED is INVALID_ARGUMENT."""
    call = ctx.stub.SubscribeRuntimeEvents(O.SubscribeRuntimeEventsRequest(types=[0]), timeout=30)
    exc = await ctx.rejected(call, C.INVALID_ARGUMENT, C.UNIMPLEMENTED, what="SubscribeRuntimeEvents([UNSPECIFIED])")
    if exc.code() == C.UNIMPLEMENTED:
        raise Skip("SubscribeRuntimeEvents is UNIMPLEMENTED")


@check("runtime.type_filter", "always (UNIMPLEMENTED accepted)")
async def type_filter(ctx):
    """A subscription to one type never receives events of another type; events are well-formed."""
    seen_any = False
    everything = await _collect(ctx, [])
    present = {r.runtime_event.type for r in everything if r.WhichOneof("event") == "runtime_event"}
    for r in everything:
        if r.WhichOneof("event") == "runtime_event":
            e = r.runtime_event
            expect(e.type != 0, "a runtime event has type UNSPECIFIED")
            expect(e.event_id, "a runtime event has no event_id")
    # filter on one type that occurs (if any) and on one that does not occur unfiltered
    probes = sorted(present)[:1] + [t for t in TYPES if t not in present][:1]
    for t in probes:
        got = await _collect(ctx, [t])
        for r in got:
            if r.WhichOneof("event") == "runtime_event":
                seen_any = True
                expect(r.runtime_event.type == t, f"subscribed to {O.RuntimeEventType.Name(t)}, got "
                       f"{O.RuntimeEventType.Name(r.runtime_event.type)}")
    if not present and not seen_any:
        raise Skip("no runtime events arrived (filtering not observable)")
