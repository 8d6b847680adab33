"""Abort, cancellation, deadlines, admission, drain and health over real gRPC."""

from __future__ import annotations

import grpc
import pytest
from helpers import collect, eventually, expect_status, gen_request, read_rest, rejection
from stream_contract import check_generate_stream

from openengine_adapters.errors import RETRY_AFTER_TRAILER
from openengine_adapters.types import EngineRole, ErrorCode, HealthState
from openengine_adapters.v1 import embedding_pb2, generation_pb2, kv_pb2, lifecycle_pb2, tasks_pb2
from openengine_adapters.v1 import observability_pb2 as obs

SLOW = {"fake.step_delay_ms": "20"}


def slow_request(rid: str, max_tokens: int = 200, **kw) -> generation_pb2.GenerateRequest:
    return gen_request("hi", request_id=rid, metadata=SLOW,
                       stopping=generation_pb2.StoppingOptions(max_tokens=max_tokens), **kw)


def idle(h) -> bool:
    return not h.fake.running and len(h.service.registry) == 0 and h.service.admission.in_flight == 0


async def running_count(h) -> int:
    return (await h.stub.GetLoad(obs.GetLoadRequest())).running_requests


# ---------------------------------------------------------------- abort

async def test_abort_by_id_cancels_remaining_outputs(oe):
    req = slow_request("a1", sampling=generation_pb2.SamplingParams(num_sequences=2))
    call = oe.stub.Generate(req)
    first = await call.read()
    resp = await oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id="a1"))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    rest = await read_rest(call)
    s = check_generate_stream(req, [first, *rest])
    assert {f.reason for f in s.finished.values()} == {generation_pb2.FINISH_REASON_CANCELLED}
    assert sorted(s.finished) == [0, 1]
    await eventually(lambda: idle(oe))
    assert await running_count(oe) == 0
    again = await oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id="a1"))
    assert again.status == lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED


async def test_abort_finished_request_is_already_finished(oe):
    await collect(oe.stub, gen_request("hi", request_id="done1"))
    resp = await oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id="done1"))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED


async def test_abort_unknown_and_malformed(oe):
    exc = await expect_status(oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id="nope")),
                              grpc.StatusCode.NOT_FOUND, "nope")
    assert rejection(exc).code == ErrorCode.REQUEST_NOT_FOUND
    await expect_status(oe.stub.Abort(lifecycle_pb2.AbortRequest()), grpc.StatusCode.INVALID_ARGUMENT,
                        "target")
    await expect_status(oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id="")),
                        grpc.StatusCode.INVALID_ARGUMENT, "request_id")
    exc = await expect_status(
        oe.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=kv_pb2.KvSessionRef(session_id="zz"))),
        grpc.StatusCode.NOT_FOUND, "zz")
    assert rejection(exc).code == ErrorCode.KV_SESSION_NOT_FOUND


async def test_abort_all(oe):
    calls = [oe.stub.Generate(slow_request(f"all{i}")) for i in range(3)]
    for c in calls:
        await c.read()
    resp = await oe.stub.Abort(lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests()))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED and "3" in resp.message
    for c in calls:
        last = (await read_rest(c))[-1]
        assert last.finished.reason == generation_pb2.FINISH_REASON_CANCELLED
    await eventually(lambda: idle(oe))


async def test_abort_task_request(oe):
    req = embedding_pb2.EmbedRequest(
        context=tasks_pb2.TaskRequestContext(request_id="e1", model="tiny", metadata={
            "fake.step_delay_ms": "2000"}),
        inputs=[tasks_pb2.TaskInput(item_id="x", text="abc")])
    call = oe.stub.Embed(req)
    await eventually(lambda: oe.service.registry.get("e1") is not None)
    resp = await oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id="e1"))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    await expect_status(call, grpc.StatusCode.CANCELLED)
    await eventually(lambda: idle(oe))
    assert "e1" in oe.fake.aborted


async def test_abort_by_kv_session_on_decode_and_prefill(serve):
    async with serve(None, role=EngineRole.DECODE) as h:
        ref = kv_pb2.KvSessionRef(session_id="sess-9", transfer_backend="fake")
        ref.attributes_struct.update({"room": 1})
        req = slow_request("d1", kv=generation_pb2.KvOptions(session=ref))
        call = h.stub.Generate(req)
        await call.read()
        resp = await h.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=ref))
        assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
        assert (await read_rest(call))[-1].finished.reason == generation_pb2.FINISH_REASON_CANCELLED
        await eventually(lambda: idle(h))
    async with serve(None, role=EngineRole.PREFILL) as h:
        responses = await collect(h.stub, gen_request("hi", request_id="p1"))
        ref = responses[-1].prefill_ready.kv_session
        assert h.service.open_kv_sessions() == 1
        resp = await h.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=ref))
        assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
        assert h.service.open_kv_sessions() == 0
        await expect_status(h.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=ref)),
                            grpc.StatusCode.NOT_FOUND)


# ---------------------------------------------------------------- cancellation and deadlines

async def test_client_cancel_stops_engine_work(oe):
    call = oe.stub.Generate(slow_request("c1"))
    await call.read()
    call.cancel()
    await eventually(lambda: idle(oe))
    assert "c1" in oe.fake.aborted
    assert await running_count(oe) == 0
    # the id is free again once the engine confirmed the end
    await collect(oe.stub, gen_request("hi", request_id="c1"))


async def test_deadline_stops_engine_work(oe):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in oe.stub.Generate(slow_request("dl"), timeout=0.2):
            pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: idle(oe))
    assert "dl" in oe.fake.aborted


async def test_cancelled_unary_task_stops_engine_work(oe):
    req = embedding_pb2.EmbedRequest(
        context=tasks_pb2.TaskRequestContext(request_id="t1", model="tiny", metadata={
            "fake.step_delay_ms": "5000"}),
        inputs=[tasks_pb2.TaskInput(item_id="x", text="abc")])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await oe.stub.Embed(req, timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: idle(oe))


# ---------------------------------------------------------------- admission

async def test_admission_limit_rejects_with_retry_hint_and_frees_slots(serve):
    async with serve({"max_in_flight": 2, "retry_after_ms": 250}) as h:
        calls = [h.stub.Generate(slow_request(f"adm{i}")) for i in range(2)]
        for c in calls:
            await c.read()
        exc = await expect_status(h.stub.Generate(gen_request("hi")), grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  "limit")
        err = rejection(exc)
        assert err.code == ErrorCode.OVERLOADED and err.retryable and err.retry_after_ms == 250
        assert (RETRY_AFTER_TRAILER, "250") in tuple(exc.trailing_metadata())
        req = embedding_pb2.EmbedRequest(context=tasks_pb2.TaskRequestContext(request_id="e", model="tiny"),
                                         inputs=[tasks_pb2.TaskInput(item_id="x", text="a")])
        await expect_status(h.stub.Embed(req), grpc.StatusCode.RESOURCE_EXHAUSTED)
        for c in calls:
            c.cancel()
        await eventually(lambda: idle(h))
        await collect(h.stub, gen_request("hi"))


# ---------------------------------------------------------------- drain

async def drain(h, **kw) -> list[lifecycle_pb2.DrainResponse]:
    return [r async for r in h.stub.Drain(lifecycle_pb2.DrainRequest(**kw), timeout=10)]


async def test_drain_idle_completes_with_zero_counts(oe):
    events = await drain(oe, stop_accepting_new_requests=True)
    assert [e.state for e in events] == [lifecycle_pb2.DRAIN_STATE_STARTED, lifecycle_pb2.DRAIN_STATE_COMPLETE]
    assert events[-1].HasField("in_flight_requests") and events[-1].in_flight_requests == 0
    exc = await expect_status(oe.stub.Generate(gen_request("hi")), grpc.StatusCode.UNAVAILABLE, "draining")
    assert rejection(exc).code == ErrorCode.DRAINING
    health = await oe.stub.Health(lifecycle_pb2.HealthRequest())
    assert health.state == lifecycle_pb2.HEALTH_STATE_DRAINING


async def test_drain_that_breaks_before_its_first_event_is_internal_with_the_trailer(oe, monkeypatch):
    """A backend bug before the first response is a precise status with the EngineError trailer (the wire
    answers whatever a handler raises before it responds), not gRPC's bare UNKNOWN; the server keeps serving."""
    def broken():
        raise RuntimeError("session table unreadable")

    monkeypatch.setattr(oe.fake, "open_kv_sessions", broken)
    exc = await expect_status(oe.stub.Drain(lifecycle_pb2.DrainRequest()), grpc.StatusCode.INTERNAL,
                              "session table unreadable")
    assert rejection(exc).code == ErrorCode.INTERNAL
    monkeypatch.undo()
    assert (await drain(oe))[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE


async def test_drain_waits_for_in_flight_work(oe):
    req = slow_request("w1", max_tokens=10)
    call = oe.stub.Generate(req)
    await call.read()
    events = await drain(oe, stop_accepting_new_requests=True)
    states = [e.state for e in events]
    assert states[0] == lifecycle_pb2.DRAIN_STATE_STARTED and events[0].in_flight_requests == 1
    assert states[-1] == lifecycle_pb2.DRAIN_STATE_COMPLETE
    assert all(s == lifecycle_pb2.DRAIN_STATE_IN_PROGRESS for s in states[1:-1])
    last = (await read_rest(call))[-1]
    assert last.finished.reason == generation_pb2.FINISH_REASON_LENGTH  # finished, not aborted


async def test_drain_immediate_deadline_aborts_with_draining_error(oe):
    req = slow_request("w2")
    call = oe.stub.Generate(req)
    first = await call.read()
    events = await drain(oe, stop_accepting_new_requests=True, deadline_ms=0, abort_after_deadline=True)
    assert events[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE
    s = check_generate_stream(req, [first, *await read_rest(call)])
    assert s.error.code == ErrorCode.DRAINING and s.error.retryable
    await eventually(lambda: idle(oe))


async def test_drain_deadline_without_abort_ends_with_error(oe):
    call = oe.stub.Generate(slow_request("w3"))
    await call.read()
    events = await drain(oe, stop_accepting_new_requests=False, deadline_ms=50)
    assert events[-1].WhichOneof("event") == "error"
    assert events[-1].error.code == ErrorCode.DRAINING and "1 requests" in events[-1].error.message
    # the request keeps running and new work is still accepted (stop_accepting was false)
    await collect(oe.stub, gen_request("hi", stopping=generation_pb2.StoppingOptions(max_tokens=1)))
    call.cancel()


async def test_drain_counts_open_kv_sessions_on_prefill(serve):
    async with serve(None, role=EngineRole.PREFILL) as h:
        await collect(h.stub, gen_request("hi"))
        events = await drain(h, stop_accepting_new_requests=True, deadline_ms=100, abort_after_deadline=True)
        assert events[0].open_kv_sessions == 1
        assert events[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE and events[-1].open_kv_sessions == 0


# ---------------------------------------------------------------- health

async def test_health_probe_and_checks(oe):
    plain = await oe.stub.Health(lifecycle_pb2.HealthRequest())
    assert plain.state == lifecycle_pb2.HEALTH_STATE_READY
    assert {c.name for c in plain.checks} >= {"grpc", "scheduler", "role"}
    assert oe.fake.probe_calls == 0
    probed = await oe.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
    probe = next(c for c in probed.checks if c.name == "inference_probe")
    assert probe.state == lifecycle_pb2.HEALTH_STATE_READY and oe.fake.probe_calls == 1
    await expect_status(oe.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True,
                                                                   model="nope")),
                        grpc.StatusCode.NOT_FOUND)
    wrong = await oe.stub.Health(lifecycle_pb2.HealthRequest(role=EngineRole.PREFILL))
    assert wrong.state == lifecycle_pb2.HEALTH_STATE_NOT_READY
    oe.fake.health_state = HealthState.DEGRADED
    assert (await oe.stub.Health(lifecycle_pb2.HealthRequest())).state == lifecycle_pb2.HEALTH_STATE_DEGRADED


async def test_failing_probe_reports_not_ready(oe):
    async def broken(model, role):
        raise RuntimeError("engine dead")

    oe.fake.probe = broken
    resp = await oe.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
    assert resp.state == lifecycle_pb2.HEALTH_STATE_NOT_READY
    probe = next(c for c in resp.checks if c.name == "inference_probe")
    assert "engine dead" in probe.message


async def test_prefill_probe_releases_its_session(serve):
    async with serve(None, role=EngineRole.PREFILL) as h:
        resp = await h.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
        probe = next(c for c in resp.checks if c.name == "inference_probe")
        assert probe.state == lifecycle_pb2.HEALTH_STATE_READY, probe.message
        assert "prefill" in probe.message and h.service.open_kv_sessions() == 0
