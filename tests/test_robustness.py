"""Races and failures around acceptance, abort, drain and event streams (review regressions)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fake_backend import FakeBackend
from helpers import collect, eventually, expect_status, gen_request, read_rest, rejection

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import ErrorCode, FinishReason
from openengine_adapters.v1 import embedding_pb2, kv_pb2, lifecycle_pb2, observability_pb2, tasks_pb2
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.wire.v0_1.stub import V01Stub

SLOW = {"fake.step_delay_ms": "20"}
SLOW_STORM = {"fake.step_delay_ms": "500"}  # 1,000 streams at 2 tokens/s each: the storm, not the decoding, is the load


def slow(rid: str, max_tokens: int = 200) -> g.GenerateRequest:
    return gen_request("hi", request_id=rid, metadata=SLOW, stopping=g.StoppingOptions(max_tokens=max_tokens))


def idle(h) -> bool:
    return len(h.service.registry) == 0 and h.service.admission.in_flight == 0


class CancelledFinishesOnAbort(FakeBackend):
    """Like vLLM's engine: an aborted request ends with 'cancelled' finishes for every output."""

    async def _decode(self, params, stop, delay):
        async for chunk in super()._decode(params, stop, delay):
            yield chunk
        if stop.is_set():
            yield be.GenerationChunk(outputs=[be.OutputDelta(i, finish_reason=FinishReason.CANCELLED)
                                              for i in range(params.sampling.num_sequences)])


async def test_drain_abort_is_a_retryable_draining_error_whatever_the_engine_reports(serve):
    async with serve() as h:
        h.service.backend = backend = CancelledFinishesOnAbort()
        h.fake = backend
        call = h.stub.Generate(slow("d1"))
        await call.read()
        events = [e async for e in h.stub.Drain(lifecycle_pb2.DrainRequest(
            stop_accepting_new_requests=True, deadline_ms=0, abort_after_deadline=True))]
        assert events[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE
        last = (await read_rest(call))[-1]
        assert last.error.code == ErrorCode.DRAINING and last.error.retryable


class SlowAcceptSlowAbort(FakeBackend):
    async def generate(self, params):
        await asyncio.sleep(0.2)
        return await super().generate(params)

    async def abort(self, ids):
        await asyncio.sleep(0.3)
        await super().abort(ids)


async def test_abort_during_acceptance_leaks_nothing(serve):
    async with serve() as h:
        h.service.backend = SlowAcceptSlowAbort()
        call = h.stub.Generate(slow("leak1"), timeout=0.4)
        await asyncio.sleep(0.05)
        abort = asyncio.ensure_future(h.stub.Abort(lifecycle_pb2.AbortRequest(request_id="leak1")))
        try:
            await read_rest(call)
        except grpc.aio.AioRpcError:
            pass
        await abort
        await eventually(lambda: idle(h))
        await collect(h.stub, slow("leak1", 2))  # the id is free again


async def test_failing_abort_during_drain_is_a_terminal_error_then_ok(oe):
    call = oe.stub.Generate(slow("d2"))
    await call.read()

    async def broken_abort(ids):
        raise RuntimeError("engine core gone")

    oe.fake.abort = broken_abort
    drain = oe.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True, deadline_ms=0,
                                                    abort_after_deadline=True))
    events = [e async for e in drain]
    assert [e.WhichOneof("event") for e in events] == ["state", "error"]
    assert "engine core gone" in events[-1].error.message
    assert await drain.code() == grpc.StatusCode.OK
    call.cancel()


async def test_task_aborted_by_drain_is_retryable(oe):
    req = embedding_pb2.EmbedRequest(
        context=tasks_pb2.TaskRequestContext(request_id="t1", model="tiny", metadata={"fake.step_delay_ms": "3000"}),
        inputs=[tasks_pb2.TaskInput(item_id="x", text="abc")])
    call = oe.stub.Embed(req)
    await eventually(lambda: oe.service.registry.get("t1") is not None)
    [e async for e in oe.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True, deadline_ms=0,
                                                               abort_after_deadline=True))]
    exc = await expect_status(call, grpc.StatusCode.UNAVAILABLE)
    err = rejection(exc)
    assert err.code == ErrorCode.DRAINING and err.retryable and err.HasField("retry_after_ms")


async def test_event_stream_that_cannot_start_is_a_precise_status(oe):
    def refuse(*args):
        raise EngineFailure(ErrorCode.INTERNAL, "kv publisher not running")

    oe.fake.kv_events = refuse
    await expect_status(oe.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest()), grpc.StatusCode.INTERNAL,
                        "kv publisher not running")

    def crash(*args):
        raise RuntimeError("boom")

    oe.fake.kv_events = crash
    await expect_status(oe.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest()), grpc.StatusCode.INTERNAL,
                        "boom")


async def test_label_only_scorer_refuses_native_scoring_before_acceptance(serve):
    from dataclasses import replace

    from fake_backend import default_card

    from openengine_adapters.v1 import scoring_pb2

    card = default_card()
    card = replace(card, tasks=replace(card.tasks, score=replace(card.tasks.score, native_scoring=False)))
    async with serve(None, cards=[card]) as h:
        group = scoring_pb2.ScoreGroup(group_id="g", query=tasks_pb2.TaskInput(item_id="q", text="a"),
                                       candidates=[tasks_pb2.TaskInput(item_id="c", text="b")])
        ctx = tasks_pb2.TaskRequestContext(request_id="s", model="tiny")
        await expect_status(h.stub.Score(scoring_pb2.ScoreRequest(context=ctx, groups=[group])),
                            grpc.StatusCode.INVALID_ARGUMENT, "label_token_ids")
        resp = await h.stub.Score(scoring_pb2.ScoreRequest(context=ctx, groups=[group],
                                                           options=scoring_pb2.ScoreOptions(label_token_ids=[5])))
        assert list(resp.label_token_ids) == [5]


def test_replay_endpoint_wildcards_are_replaced_with_the_advertised_host():
    from openengine_adapters.kv_events.sources import with_host

    assert with_host("tcp://*:5558", "10.0.0.7") == "tcp://10.0.0.7:5558"
    assert with_host("tcp://0.0.0.0:5558", "h") == "tcp://h:5558"
    assert with_host("tcp://[::]:5558", "fd00::7") == "tcp://[fd00::7]:5558"  # an IPv6 host in brackets
    assert with_host("tcp://node-3:5558", "h") == "tcp://node-3:5558"
    assert with_host("ipc:///tmp/kv", "h") == "ipc:///tmp/kv"
    assert with_host("", "h") == ""


async def test_a_hanging_engine_abort_does_not_hold_the_request_forever(oe, monkeypatch):
    from openengine_adapters.core import generation

    monkeypatch.setattr(generation, "ABORT_TIMEOUT_S", 0.2)

    async def hang(ids):
        await asyncio.sleep(3600)

    oe.fake.abort = hang
    call = oe.stub.Generate(slow("hang1"))
    await call.read()
    call.cancel()
    await eventually(lambda: idle(oe), timeout=3)


STORM = 1000


@pytest.mark.parametrize("surface", ["revision-1", "v0.1.0"])
async def test_a_1000_stream_cancellation_storm_leaves_nothing_running_and_frees_every_slot(serve, surface):
    """1,000 streams open at once on one surface (the admission limit exactly), ended every way a
    client ends one: cancelled before the first token, cancelled after it, a deadline, Abort by id.
    Afterwards no engine request runs, the registry is empty, every slot is free (the limit admits
    1,000 streams again) and the service still generates."""
    import random

    async with serve({"max_in_flight": STORM}) as h:
        channels = [grpc.aio.insecure_channel(h.target) for _ in range(8)]
        stubs = [h.stub.__class__(c) if surface == "revision-1" else V01Stub(c) for c in channels]
        rng = random.Random(1000)
        ends = {"cancel before": 0, "cancel after": 0, "deadline": 0, "abort": 0}

        def start(i: int, timeout: float | None = 60):
            req = gen_request("hi", request_id=f"storm-{i}", stopping=g.StoppingOptions(max_tokens=200))
            if surface == "revision-1":
                req.metadata.update(SLOW_STORM)
                return stubs[i % len(stubs)].Generate(req, timeout=timeout)
            return stubs[i % len(stubs)].Generate(req, timeout=timeout, metadata=tuple(SLOW_STORM.items()))

        async def one(i: int) -> None:
            how = rng.choice(tuple(ends))
            ends[how] += 1
            call = start(i, timeout=rng.uniform(0.3, 1.5) if how == "deadline" else 60)
            if how == "cancel before":
                await asyncio.sleep(rng.uniform(0, 0.05))
                call.cancel()
                return
            try:
                first = await call.read()
                assert first.WhichOneof("event") == "token", first
                if how == "cancel after":
                    await asyncio.sleep(rng.uniform(0, 0.3))
                    call.cancel()
                elif how == "abort":
                    await stubs[i % len(stubs)].Abort(lifecycle_pb2.AbortRequest(request_id=f"storm-{i}"), timeout=30)
                    last = (await read_rest(call))[-1]
                    assert last.WhichOneof("event") in ("finished", "error"), last
                else:
                    await read_rest(call)
                    raise AssertionError("a 200-token slow stream outlived its deadline")
            except grpc.aio.AioRpcError as exc:
                assert how == "deadline" and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc

        try:
            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(STORM))), 120)
            assert min(ends.values()) > STORM // 8, ends
            await eventually(lambda: idle(h) and not h.fake.running, timeout=20)
            for stub in stubs[:1]:
                load = await stub.GetLoad(observability_pb2.GetLoadRequest())
                assert load.running_requests == 0, load
            # every slot free: the limit admits STORM streams again, then refuses one more
            again = [start(i + STORM) for i in range(STORM)]
            for call in again:
                assert (await call.read()).WhichOneof("event") == "token"
            await expect_status(start(2 * STORM), grpc.StatusCode.RESOURCE_EXHAUSTED)
            for call in again:
                call.cancel()
            await eventually(lambda: idle(h) and not h.fake.running, timeout=20)
            assert (await collect(stubs[0], gen_request("after the storm")))[-1].HasField("finished")
        finally:
            for c in channels:
                await c.close()
