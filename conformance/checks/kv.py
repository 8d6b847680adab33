"""KV connector info, KV event sources and the native KV event stream."""

from __future__ import annotations

import asyncio

import grpc

from conformance.registry import CheckFailed, Skip, check, expect
from openengine_adapters.v1 import kv_pb2

C = grpc.StatusCode
WILDCARDS = {"", "*", "0.0.0.0", "::", "[::]", "0:0:0:0:0:0:0:0"}


@check("kv.connector_info", "always (UNIMPLEMENTED accepted)")
async def connector_info(ctx):
    """GetKvConnectorInfo answers (or UNIMPLEMENTED); local endpoints are never wildcards."""
    try:
        info = await ctx.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest(), timeout=30)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == C.UNIMPLEMENTED:
            raise Skip("GetKvConnectorInfo is UNIMPLEMENTED") from None
        raise
    for ep in info.local_endpoints:
        expect(ep.host not in WILDCARDS, f"local endpoint host {ep.host!r} is a wildcard")
    if info.HasField("schema_version"):
        expect(info.schema_version > 0, "schema_version reported as 0")


@check("kv.event_sources", "implemented (UNIMPLEMENTED accepted)")
async def event_sources(ctx):
    """GetKvEventSources: every endpoint_addr is a routable host:port, never a bind wildcard."""
    try:
        resp = await ctx.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(), timeout=30)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == C.UNIMPLEMENTED:
            raise Skip("GetKvEventSources is UNIMPLEMENTED") from None
        raise
    for i, src in enumerate(resp.sources):
        expect(src.transport, f"source {i} has no transport")
        expect(src.endpoint_addr.host not in WILDCARDS,
               f"source {i} endpoint_addr.host {src.endpoint_addr.host!r} is a wildcard")
        expect(src.endpoint_addr.port > 0, f"source {i} endpoint_addr.port is 0")
        if src.transport == "grpc":  # upstream: "Native OpenEngine streams should use protobuf"
            expect(src.encoding == "protobuf", f"source {i} is a grpc source with encoding {src.encoding!r}")


class _Sub:
    """A KV-event subscription read by a background task (a timed-out read would cancel the call)."""

    def __init__(self, ctx, **kw) -> None:
        self.call = ctx.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(**kw), timeout=60)
        self.events: list = []
        self.error: grpc.aio.AioRpcError | None = None
        self.ended = False
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            async for r in self.call:
                self.events.append(r)
            self.ended = True
        except grpc.aio.AioRpcError as exc:
            self.error = exc

    async def start(self) -> None:
        await asyncio.sleep(0.3)
        if self.error is not None and self.error.code() == C.UNIMPLEMENTED:
            raise Skip("SubscribeKvEvents is UNIMPLEMENTED")
        if self.error is not None:
            raise CheckFailed(f"SubscribeKvEvents failed: {self.error.code().name}: {self.error.details()}")

    async def wait(self, seconds: float, want: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline and len(self.batches()) < want and not self.task.done():
            await asyncio.sleep(0.05)

    def batches(self) -> list:
        return [r.batch for r in self.events if r.WhichOneof("event") == "batch"]

    async def close(self) -> None:
        self.call.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        kinds = [r.WhichOneof("event") for r in self.events]
        if "error" in kinds:
            expect(kinds.index("error") == len(kinds) - 1, "an event followed the terminal EngineError")
            expect(self.ended, f"the stream did not close with OK after its error event ({self.error})")


@check("kv.subscribe_events", "implemented (UNIMPLEMENTED accepted)")
async def subscribe(ctx):
    """SubscribeKvEvents: batches have strictly increasing sequence numbers; replay from a seen sequence
    number starts at that batch. "OpenEngine preserves ... monotonic sequence numbers, replay start
    sequence": per data-parallel rank the numbers a subscriber sees are consecutive, so a lost batch shows
    as a gap -- a server that cannot deliver a batch ends the subscription with an EngineError instead of
    dropping it silently."""
    sub = _Sub(ctx)
    try:
        await sub.start()
        if ctx.can_send_traffic():
            for i in range(3):
                req = ctx.request(f"kv{i}", max_tokens=2)
                if req.WhichOneof("input") == "prompt":
                    req.prompt = f"KV event {i} " + "x" * 40
                else:
                    req.token_ids.ids[:] = [10 + i] * 40
                await ctx.generate(req)
        await sub.wait(3.0, 3)
    finally:
        await sub.close()
    batches = sub.batches()
    if not batches:
        raise Skip("no KV events arrived within 3 s")
    seqs = [b.sequence_number for b in batches]
    expect(all(a < b for a, b in zip(seqs, seqs[1:], strict=False)), f"sequence numbers not increasing: {seqs}")
    per_rank: dict[int, list[int]] = {}
    for b in batches:
        per_rank.setdefault(b.data_parallel_rank, []).append(b.sequence_number)
    for rank, numbers in per_rank.items():
        gaps = [(a, b) for a, b in zip(numbers, numbers[1:], strict=False) if b != a + 1]
        expect(not gaps, f"rank {rank}: sequence numbers {numbers} skip batches at {gaps} (a batch was dropped "
               "without an error)")
    start = seqs[-1] if len(seqs) == 1 else seqs[1]
    replay = _Sub(ctx, start_sequence_number=start)
    try:
        await replay.start()
        await replay.wait(2.0, 1)
    finally:
        await replay.close()
    replayed = [b.sequence_number for b in replay.batches()]
    expect(replayed, f"replay from sequence {start} delivered nothing")
    expect(replayed[0] == start, f"replay from sequence {start} started at {replayed[0]}")
