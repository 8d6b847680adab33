"""Adaptive coalescing (core.coalescing): only the grouping of token deltas into messages changes.

Pure tests of the regrouping on scripted sources, then end to end over gRPC on the fake engine with
the server forced behind: the stream contract holds and ids, text and logprobs equal the
uncoalesced stream's, in fewer messages.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import collect, gen_request
from stream_contract import check_generate_stream

from openengine_adapters.core.coalescing import Coalescer, LoopLag, coalesced, merge
from openengine_adapters.v1 import generation_pb2 as g


def token(index: int, *ids: int, text: str = "") -> g.GenerateResponse:
    r = g.GenerateResponse(request_id="r")
    r.token.output_index = index
    r.token.text = text or "".join(chr(96 + i) for i in ids)
    for i in ids:
        r.token.tokens.add(token_id=i)
    return r


def finished(index: int) -> g.GenerateResponse:
    r = g.GenerateResponse(request_id="r")
    r.finished.output_index = index
    r.finished.reason = g.FINISH_REASON_LENGTH
    return r


class Fixed(Coalescer):
    """A policy whose window is set by the test (the server "behind" or not)."""

    def __init__(self, window: float) -> None:
        super().__init__(LoopLag(), max_delay_s=window)
        self.fixed = window

    def window(self) -> float:
        return self.fixed


async def script(*steps):
    """Batches, with ``float`` steps as pauses of the engine between them."""
    for step in steps:
        if isinstance(step, float):
            await asyncio.sleep(step)
        else:
            yield step


def shape(batches) -> list[list[tuple]]:
    def one(r):
        index = r.token.output_index if r.HasField("token") else r.finished.output_index
        return r.WhichOneof("event"), index, [t.token_id for t in r.token.tokens], r.token.text
    return [[one(r) for r in b] for b in batches]


def test_merge_joins_each_outputs_deltas_in_order():
    merged = merge([token(0, 1), token(1, 4), token(0, 2, 3), token(1, 6), token(0, 5), finished(0)])
    assert shape([merged]) == [[("token", 0, [1, 2, 3, 5], "abce"), ("token", 1, [4, 6], "df"),
                                ("finished", 0, [], "")]]


async def test_idle_server_sends_every_delta_at_once():
    out = [b async for b in coalesced(script([token(0, 1)], [token(0, 2)], [token(0, 3), finished(0)]), Fixed(0.0))]
    assert shape(out) == shape([[token(0, 1)], [token(0, 2)], [token(0, 3), finished(0)]])


async def test_busy_server_holds_deltas_until_the_window_closes():
    policy = Fixed(0.05)
    src = script([token(0, 1)], [token(0, 2)], [token(0, 3)], 0.2, [token(0, 4)], [finished(0)])
    out = [b async for b in coalesced(src, policy)]
    # the first token at once; 2 and 3 held and sent together when the window closed (the engine
    # was still busy); 4 held, then flushed with the finish, which never waits
    assert shape(out) == [[("token", 0, [1], "a")], [("token", 0, [2, 3], "bc")],
                          [("token", 0, [4], "d"), ("finished", 0, [], "")]]
    assert policy.messages_saved == 1


async def test_each_output_first_token_is_never_held():
    out = [b async for b in coalesced(script([token(0, 1)], [token(1, 7)], [token(0, 2)], [token(1, 8)],
                                             [finished(0), finished(1)]), Fixed(10.0))]
    assert shape(out)[:2] == [[("token", 0, [1], "a")], [("token", 1, [7], "g")]]
    assert shape(out)[2] == [("token", 0, [2], "b"), ("token", 1, [8], "h"), ("finished", 0, [], ""),
                             ("finished", 1, [], "")]


async def test_a_failure_after_held_deltas_sends_them_first():
    async def failing():
        yield [token(0, 1)]
        yield [token(0, 2)]
        await asyncio.sleep(0.01)
        raise RuntimeError("engine died")

    out = []
    with pytest.raises(RuntimeError, match="engine died"):
        async for b in coalesced(failing(), Fixed(10.0)):
            out.append(b)
    assert shape(out) == [[("token", 0, [1], "a")], [("token", 0, [2], "b")]]


async def test_closing_a_holding_stream_stops_the_engine_read():
    state = {"closed": False}

    async def endless():
        try:
            yield [token(0, 1)]
            while True:
                yield [token(0, 2)]
                await asyncio.sleep(0.001)
        finally:
            state["closed"] = True

    stream = coalesced(endless(), Fixed(0.05))
    assert shape([await stream.__anext__()]) == [[("token", 0, [1], "a")]]
    assert (await stream.__anext__())[0].token.tokens  # a held group arrives
    await stream.aclose()
    assert state["closed"]


async def test_loop_lag_reports_a_blocked_loop():
    lag = LoopLag(interval_s=0.002, threshold_s=0.005, smoothing=1.0)
    lag.start()
    try:
        await asyncio.sleep(0.02)
        assert not lag.behind
        import time

        time.sleep(0.05)  # the loop is blocked: the next sample is late by about this much
        await asyncio.sleep(0.001)  # the overdue sample runs first
        assert lag.behind and lag.lag_s >= 0.02
    finally:
        await lag.stop()


@pytest.mark.parametrize("outputs", [1, 3])
async def test_end_to_end_same_tokens_fewer_messages(serve, monkeypatch, outputs):
    request = gen_request("hello", stopping={"max_tokens": 40}, sampling={"num_sequences": outputs, "seed": 7},
                          response={"return_output_logprobs": True, "output_candidates": {"top_n": 2}})
    slow = (("fake.step_delay_ms", "4"),)
    async with serve({"coalesce_max_delay_ms": 0}) as h:
        plain = check_generate_stream(request, await collect_with(h, request, slow))
    async with serve({"coalesce_max_delay_ms": 30}) as h:
        monkeypatch.setattr(h.service.coalescer, "window", lambda: 0.03)  # the server is "behind"
        grouped = check_generate_stream(request, await collect_with(h, request, slow))
    assert grouped.token_ids == plain.token_ids and grouped.text == plain.text
    assert [[t.SerializeToString() for t in grouped.tokens[i]] for i in range(outputs)] == \
        [[t.SerializeToString() for t in plain.tokens[i]] for i in range(outputs)]
    assert grouped.usage == plain.usage
    assert grouped.messages < plain.messages * 0.6, (grouped.messages, plain.messages)


async def collect_with(h, request, metadata):
    return [r async for r in h.stub.Generate(request, metadata=metadata, timeout=30)]


async def test_off_by_default_and_idle_when_on(oe, serve):
    assert oe.service.coalescer is None  # experimental: opt in with --coalesce-max-delay-ms
    async with serve({"coalesce_max_delay_ms": 20}) as h:
        assert h.service.coalescer.window() == 0.0
        out = await collect(h.stub, gen_request("hi", stopping={"max_tokens": 5}))
        assert [r.WhichOneof("event") for r in out] == ["token"] * 5 + ["finished"]
