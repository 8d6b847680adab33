"""Health, GetLoad, Abort, client cancellation, admission limit and Drain."""

from __future__ import annotations

import asyncio

import grpc

from conformance.checks.task_calls import batch_request, task_capability
from conformance.context import ROLE_NAMES, G
from conformance.registry import CheckFailed, Skip, check, expect
from openengine_adapters.v1 import kv_pb2, observability_pb2
from openengine_adapters.v1 import lifecycle_pb2 as L

C = grpc.StatusCode
SERVING = (L.HEALTH_STATE_READY, L.HEALTH_STATE_DEGRADED)


@check("lifecycle.health", "always")
async def health(ctx):
    """Health without probe: READY or DEGRADED, and no inference_probe check."""
    h = await ctx.stub.Health(L.HealthRequest(), timeout=30)
    expect(h.state in SERVING, f"state {L.HealthState.Name(h.state)}")
    for c in h.checks:
        expect(c.name, "a HealthCheck has no name")
        expect(c.state != L.HEALTH_STATE_UNSPECIFIED, f"check {c.name} state UNSPECIFIED")
    expect("inference_probe" not in [c.name for c in h.checks], "inference_probe reported although not asked")


@check("lifecycle.health_probe", "always")
async def health_probe(ctx):
    """Health with include_inference_probe: READY or DEGRADED with an inference_probe check."""
    h = await ctx.stub.Health(L.HealthRequest(include_inference_probe=True, model=ctx.model), timeout=60)
    expect(h.state in SERVING, f"state {L.HealthState.Name(h.state)}: {[(c.name, c.message) for c in h.checks]}")
    probe = [c for c in h.checks if c.name == "inference_probe"]
    expect(probe, f"no inference_probe check among {[c.name for c in h.checks]}")
    expect(probe[0].state in SERVING, f"inference_probe state {L.HealthState.Name(probe[0].state)}")


@check("lifecycle.get_load", "always")
async def get_load(ctx):
    """GetLoad answers; used_kv_blocks <= total_kv_blocks; per-rank entries when asked are consistent."""
    load = await ctx.stub.GetLoad(observability_pb2.GetLoadRequest(include_per_rank=True), timeout=30)
    if load.HasField("used_kv_blocks") and load.HasField("total_kv_blocks"):
        expect(load.used_kv_blocks <= load.total_kv_blocks, "used_kv_blocks > total_kv_blocks")
    for r in load.ranks:
        if r.HasField("used_kv_blocks") and r.HasField("total_kv_blocks"):
            expect(r.used_kv_blocks <= r.total_kv_blocks, "rank used_kv_blocks > total_kv_blocks")
    if ctx.engine_info.instance_id and load.instance_id:
        expect(load.instance_id == ctx.engine_info.instance_id,
               f"LoadInfo.instance_id {load.instance_id!r} != EngineInfo.instance_id {ctx.engine_info.instance_id!r}")


OTHER_ROLE = {1: 2, 2: 3, 3: 2}  # AGGREGATED -> PREFILL, PREFILL -> DECODE, DECODE -> PREFILL


@check("lifecycle.health_expected_role", "always")
async def health_expected_role(ctx):
    """Health and abort: HealthRequest.role is the "expected role for role-specific" queries; Server identity ... and
    engine roles: "Engines must validate role/request compatibility": asked for its own role the server answers
    as usual; asked for another role it is not ready for that role's work (not READY or DEGRADED), in a defined
    state (never UNSPECIFIED), and no check is UNSPECIFIED."""
    own = await ctx.stub.Health(L.HealthRequest(role=ctx.role), timeout=30)
    expect(own.state in SERVING, f"Health(role={ctx.role_name}) of a {ctx.role_name} server is "
           f"{L.HealthState.Name(own.state)}")
    other = OTHER_ROLE.get(ctx.role)
    if other is None:
        raise Skip(f"role {ctx.role_name}")
    h = await ctx.stub.Health(L.HealthRequest(role=other), timeout=30)
    name = ROLE_NAMES.get(other, str(other))
    expect(h.state != L.HEALTH_STATE_UNSPECIFIED,
           f"Health(role={name}) of a {ctx.role_name} server answered an undefined state (UNSPECIFIED or a value "
           "this contract does not define)")
    expect(h.state not in SERVING, f"Health(role={name}) of a {ctx.role_name} server is "
           f"{L.HealthState.Name(h.state)}: it cannot serve {name} requests")
    for c in h.checks:
        expect(c.state != L.HEALTH_STATE_UNSPECIFIED, f"Health(role={name}): check {c.name!r} has an undefined state")


@check("lifecycle.load_matches_capacity", "total_kv_blocks reported by GetLoad and the model's capacity")
async def load_matches_capacity(ctx):
    """One count, two answers: LoadInfo.total_kv_blocks (Runtime observability) and the configured total (revision 1:
    ModelInfo.total_kv_blocks; v0.1.0, Server identity, deployment capacity: "total_kv_blocks is the allocatable
    block count in the server's reporting scope" of ServerInfo.capacity, "Dynamic and per-rank utilization
    remains in LoadInfo") are the same number of blocks when both are reported, and used_kv_blocks never exceeds
    it."""
    load = await ctx.stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=30)
    mi = ctx.mi()
    where = "ServerInfo.capacity" if ctx.options.contract == "v0.1.0" else "ModelInfo"
    if not (load.HasField("total_kv_blocks") and mi.HasField("total_kv_blocks")):
        raise Skip(f"total_kv_blocks is not reported by both GetLoad and {where}")
    expect(load.total_kv_blocks == mi.total_kv_blocks,
           f"LoadInfo.total_kv_blocks {load.total_kv_blocks} != {where}.total_kv_blocks {mi.total_kv_blocks}"
           + (f" (= {mi.total_kv_blocks // mi.kv_block_size} x kv_block_size {mi.kv_block_size}: tokens, not blocks?)"
              if mi.kv_block_size and mi.total_kv_blocks == load.total_kv_blocks * mi.kv_block_size else ""))
    if load.HasField("used_kv_blocks"):
        expect(load.used_kv_blocks <= mi.total_kv_blocks,
               f"LoadInfo.used_kv_blocks {load.used_kv_blocks} > {where}.total_kv_blocks {mi.total_kv_blocks}")


@check("lifecycle.abort_unknown_not_found", "always")
async def abort_unknown(ctx):
    """Abort of an unknown request id is NOT_FOUND (or UNIMPLEMENTED if abort is unsupported)."""
    await ctx.rejected(ctx.stub.Abort(L.AbortRequest(request_id="conformance-no-such-request"), timeout=30),
                       C.NOT_FOUND, C.UNIMPLEMENTED, what="Abort(unknown id)")


@check("lifecycle.abort_unknown_kv_session", "always")
async def abort_unknown_kv_session(ctx):
    """"An unknown request or KV session target returns gRPC NOT_FOUND; an engine that does not support
    abort returns gRPC UNIMPLEMENTED": Abort(kv_session) naming a session nobody created is not OK."""
    ref = kv_pb2.KvSessionRef(session_id=f"conformance-no-such-session-{ctx.rid('kv')}")
    conn = ctx.engine_info.kv_connector
    if conn.transfer_backend:
        ref.transfer_backend = conn.transfer_backend
    await ctx.rejected(ctx.stub.Abort(L.AbortRequest(kv_session=ref), timeout=30), C.NOT_FOUND, C.UNIMPLEMENTED,
                       what="Abort(unknown kv_session)")


@check("lifecycle.abort_no_target", "always")
async def abort_no_target(ctx):
    """Abort without a target is INVALID_ARGUMENT."""
    await ctx.rejected(ctx.stub.Abort(L.AbortRequest(), timeout=30), C.INVALID_ARGUMENT, what="Abort()")


LOAD_SCALARS = ("timestamp_unix_nanos", "running_requests", "queued_requests", "active_kv_sessions", "used_kv_blocks",
                "total_kv_blocks", "running_tokens", "waiting_tokens", "prefill_batch_size", "decode_batch_size")


@check("lifecycle.load_presence", "role AGGREGATED (a long request can run)")
async def load_presence(ctx):
    """"Every load scalar has explicit presence. Absent means unavailable in that engine or snapshot; present
    zero means the measured load is zero": a scalar the engine reports while a request runs is present
    (as zero where it is zero) when the engine is idle, and the other way round."""
    ctx.require_generation()
    await ctx.wait_idle("earlier checks")
    idle = await ctx.stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=30)
    req, call, _ = await _start_long(ctx, "load")
    try:
        busy = await ctx.stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=30)
    finally:
        call.cancel()
    await ctx.wait_idle("cancelling the long request")
    idle_set = {f for f in LOAD_SCALARS if idle.HasField(f)}
    busy_set = {f for f in LOAD_SCALARS if busy.HasField(f)}
    expect(busy_set <= idle_set, f"reported while busy, absent while idle: {sorted(busy_set - idle_set)} (a measured "
           "zero is a present zero)")
    expect(idle_set <= busy_set, f"reported while idle, absent while busy: {sorted(idle_set - busy_set)}")


async def _start_long(ctx, tag: str):
    req = ctx.long_request(tag)
    call = ctx.stub.Generate(req, timeout=ctx.options.check_timeout_s)
    first = await call.read()
    expect(first is not grpc.aio.EOF, "the long request ended without events")
    if first.WhichOneof("event") in ("finished", "error"):
        call.cancel()
        raise Skip("the long request finished at once; pass --long-request-metadata to slow the engine")
    return req, call, [first]


async def _rest(call) -> list:
    out = []
    while (r := await call.read()) is not grpc.aio.EOF:
        out.append(r)
    return out


def _check_cancelled(req, responses) -> None:
    from conformance.context import check_stream

    s = check_stream(req, responses)
    if s.error is not None:
        return  # one terminal EngineError is allowed instead of CANCELLED finishes
    reasons = {i: f.reason for i, f in s.finished.items()}
    expect(any(r == G.FINISH_REASON_CANCELLED for r in reasons.values()),
           f"aborted stream ended without a CANCELLED finish: {reasons}")


@check("lifecycle.abort_running", "role AGGREGATED")
async def abort_running(ctx):
    """Abort(request_id) of a running request is ABORTED; its stream ends with CANCELLED finishes (or one
    EngineError); aborting again is ALREADY_FINISHED; running_requests returns to 0. On an engine fast
    enough to finish the long request before the Abort arrives, ALREADY_FINISHED must match a stream that
    really finished (not cancelled); the check then tries again (three times at most) before skipping."""
    ctx.require_generation()
    for _attempt in range(3):
        req, call, got = await _start_long(ctx, "abort")
        try:
            resp = await ctx.stub.Abort(L.AbortRequest(request_id=req.request_id), timeout=30)
            expect(resp.status in (L.ABORT_STATUS_ABORTED, L.ABORT_STATUS_ALREADY_FINISHED),
                   f"Abort status {L.AbortStatus.Name(resp.status)}, expected ABORTED")
            got += await asyncio.wait_for(_rest(call), ctx.options.check_timeout_s)
        finally:
            call.cancel()
        if resp.status == L.ABORT_STATUS_ABORTED:
            break
        from conformance.context import check_stream

        s = check_stream(req, got)  # the request won the race: it must really have finished
        expect(s.error is None and all(f.reason != G.FINISH_REASON_CANCELLED for f in s.finished.values()),
               "Abort answered ALREADY_FINISHED for a request whose stream was cancelled or failed")
    else:
        raise Skip("the long request finished before each Abort arrived; pass --long-request-metadata to slow "
                   "the engine")
    _check_cancelled(req, got)
    again = await ctx.stub.Abort(L.AbortRequest(request_id=req.request_id), timeout=30)
    expect(again.status == L.ABORT_STATUS_ALREADY_FINISHED,
           f"second Abort status {L.AbortStatus.Name(again.status)}, expected ALREADY_FINISHED")
    await ctx.wait_idle("Abort")


@check("lifecycle.client_cancel_releases", "role AGGREGATED")
async def client_cancel(ctx):
    """A client-cancelled stream is released: running_requests returns to 0 and its id can be reused."""
    ctx.require_generation()
    req, call, _ = await _start_long(ctx, "cancel")
    call.cancel()
    await ctx.wait_idle("client cancellation")
    if await ctx.running_requests() is None:
        await asyncio.sleep(0.5)
    again = ctx.request("reuse", max_tokens=2)
    again.request_id = req.request_id
    try:
        await ctx.run(again)
    except CheckFailed as exc:
        raise CheckFailed(f"the id of a cancelled request is still taken: {exc}") from None


@check("lifecycle.admission_limit", "--expect-admission-limit N")
async def admission_limit(ctx):
    """With N admitted long streams open, one more is RESOURCE_EXHAUSTED before any event."""
    n = ctx.options.expect_admission_limit
    if n is None:
        raise Skip("no --expect-admission-limit given")
    ctx.require_generation()
    calls = []
    try:
        for i in range(n):
            _, call, _ = await _start_long(ctx, f"adm{i}")
            calls.append(call)
        exc = await ctx.gen_rejected(ctx.long_request("adm-over"), C.RESOURCE_EXHAUSTED,
                                     what=f"request {n + 1} beyond the admission limit {n}")
        del exc
    finally:
        for call in calls:
            call.cancel()
    await ctx.wait_idle("cancelling the admitted streams")


@check("lifecycle.abort_all_requests", "always", destructive=True, order=1)
async def abort_all(ctx):
    """Abort(all_requests) ends a running request with CANCELLED (or one EngineError)."""
    ctx.require_generation()
    req, call, got = await _start_long(ctx, "abortall")
    try:
        resp = await ctx.stub.Abort(L.AbortRequest(all_requests=L.AllRequests()), timeout=30)
        expect(resp.status in (L.ABORT_STATUS_ABORTED, L.ABORT_STATUS_ALREADY_FINISHED),
               f"Abort(all) status {L.AbortStatus.Name(resp.status)}")
        got += await asyncio.wait_for(_rest(call), ctx.options.check_timeout_s)
    finally:
        call.cancel()
    _check_cancelled(req, got)
    await ctx.wait_idle("Abort(all_requests)")


@check("lifecycle.drain", "always", destructive=True, order=100)
async def drain(ctx):
    """Drain(stop_accepting): STARTED, IN_PROGRESS*, COMPLETE with counts present and 0 at the end; then
    Health is not READY and new requests are refused before acceptance."""
    events = []
    call = ctx.stub.Drain(L.DrainRequest(stop_accepting_new_requests=True, deadline_ms=10_000,
                                         abort_after_deadline=True), timeout=60)
    async for r in call:
        events.append(r)
    expect(events, "Drain stream ended without events")
    kinds = [r.WhichOneof("event") for r in events]
    expect("error" not in kinds[:-1], "events after a drain EngineError")
    if kinds[-1] == "error":
        raise CheckFailed(f"drain failed: {events[-1].error}")
    states = [r.state for r in events]
    expect(states[0] == L.DRAIN_STATE_STARTED, f"first drain state {L.DrainState.Name(states[0])}, expected STARTED")
    expect(states[-1] == L.DRAIN_STATE_COMPLETE, f"last drain state {L.DrainState.Name(states[-1])}")
    expect(all(s == L.DRAIN_STATE_IN_PROGRESS for s in states[1:-1]),
           f"drain states {[L.DrainState.Name(s) for s in states]}")
    expect(len(states) >= 2, "drain stream has only one event")
    last = events[-1]
    expect(last.HasField("in_flight_requests"), "COMPLETE has no in_flight_requests count")
    expect(last.in_flight_requests == 0, f"COMPLETE reports {last.in_flight_requests} in-flight requests")
    if last.HasField("open_kv_sessions"):
        expect(last.open_kv_sessions == 0, f"COMPLETE reports {last.open_kv_sessions} open KV sessions")
    h = await ctx.stub.Health(L.HealthRequest(), timeout=30)
    expect(h.state not in SERVING, f"Health is {L.HealthState.Name(h.state)} after a drain that stops accepting")
    codes = [c for c in C if c != C.OK]
    if ctx.role not in (2, 3) and ctx.generates():
        await ctx.gen_rejected(ctx.request("afterdrain", max_tokens=2), *codes, what="Generate after Drain")
    # stop_accepting_new_requests covers every inference RPC, Embed/Classify/Score included
    for task in ("embed", "classify", "score"):
        cap = task_capability(ctx, task)
        if cap is not None:
            await ctx.rejected(batch_request(ctx, task, cap, "afterdrain"), *codes,
                               what=f"{task} after Drain")


@check("lifecycle.drain_deadline_zero", "role AGGREGATED", destructive=True, order=50)
async def drain_deadline_zero(ctx):
    """"An absent deadline_ms means no deadline; an explicit zero means the deadline is immediate": a drain
    with deadline_ms 0 and abort_after_deadline ends the running request at once (CANCELLED finishes or one
    EngineError) and COMPLETEs; without stop_accepting_new_requests the server still takes new work."""
    ctx.require_generation()
    req, call, got = await _start_long(ctx, "drain0")
    try:
        events = [r async for r in ctx.stub.Drain(L.DrainRequest(stop_accepting_new_requests=False, deadline_ms=0,
                                                                 abort_after_deadline=True), timeout=60)]
        got += await asyncio.wait_for(_rest(call), ctx.options.check_timeout_s)
    finally:
        call.cancel()
    expect(events and events[-1].WhichOneof("event") == "state" and events[-1].state == L.DRAIN_STATE_COMPLETE,
           f"the drain did not COMPLETE: {[r.WhichOneof('event') for r in events]}")
    from conformance.context import check_stream

    s = check_stream(req, got)
    expect(s.error is not None or any(f.reason == G.FINISH_REASON_CANCELLED for f in s.finished.values()),
           f"deadline_ms 0 did not end the running request: it finished with "
           f"{[G.FinishReason.Name(f.reason) for f in s.finished.values()]} after {len(s.token_ids.get(0, []))} tokens")
    await ctx.wait_idle("the immediate drain")
    await ctx.run(ctx.request("afterdrain0", max_tokens=2))
