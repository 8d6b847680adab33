"""Adaptive coalescing (core.coalescing): only the grouping of token deltas into messages changes.

Pure tests of the regrouping on scripted sources, then end to end over gRPC on the fake engine with
the server forced behind: the stream contract holds and ids, text and logprobs equal the
uncoalesced stream's, in fewer messages.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest
from helpers import collect, gen_request
from stream_contract import check_generate_stream

from openengine_adapters.core.coalescing import MIN_TICK_S, MessageBudget, coalesced, merge
from openengine_adapters.server_config import add_server_args, plugin_server_config, server_config_from_args
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


class Fixed(MessageBudget):
    """A policy whose spacing is set by the test (the engine over the budget or not); it ticks
    while a test's ``coalesced`` runs."""

    def __init__(self, spacing: float) -> None:
        super().__init__(max_delay_s=spacing, budget_per_s=1.0, chunks=lambda: 0, streams=lambda: 1)
        self.spacing = spacing

    def sample(self, now: float) -> None:
        pass


async def regrouped(source, policy: MessageBudget, timed: bool = False) -> list:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    policy.start()
    try:
        return [(loop.time() - t0, b) if timed else b async for b in coalesced(source, policy)]
    finally:
        await policy.stop()


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
    out = await regrouped(script([token(0, 1)], [token(0, 2)], [token(0, 3), finished(0)]), Fixed(0.0))
    assert shape(out) == shape([[token(0, 1)], [token(0, 2)], [token(0, 3), finished(0)]])


async def test_above_the_budget_streams_send_at_the_ticks():
    policy = Fixed(0.05)
    src = script([token(0, 1)], 0.005, [token(0, 2)], 0.01, [token(0, 3)], 0.2, [token(0, 4)], 0.01, [finished(0)])
    out = await regrouped(src, policy, timed=True)
    # the first token at once; 2 and 3 wait for the policy's next tick (every 50 ms) and share a
    # message; 4 waits for a tick too, but the finish 10 ms later never waits, and takes it along
    assert shape([b for _, b in out]) == [[("token", 0, [1], "a")], [("token", 0, [2, 3], "bc")],
                                          [("token", 0, [4], "d"), ("finished", 0, [], "")]]
    times = [t for t, _ in out]
    assert times[0] < 0.02 and 0.04 <= times[1] < 0.15, times
    assert 0.225 <= times[2] < 0.225 + 0.03, times
    assert policy.messages_saved == 1


async def test_a_finish_flushes_held_deltas_at_once():
    src = script([token(0, 1)], 0.005, [token(0, 2)], 0.02, [token(0, 3)], [finished(0)])
    out = await regrouped(src, Fixed(10.0), timed=True)
    assert shape([b for _, b in out]) == [[("token", 0, [1], "a")],
                                          [("token", 0, [2, 3], "bc"), ("finished", 0, [], "")]]
    assert out[-1][0] < 1.0


async def test_streams_holding_tokens_flush_together_at_a_tick():
    policy = Fixed(0.04)
    a = script([token(0, 1)], 0.003, [token(0, 2)], 0.003, [token(0, 3)], 0.1, [finished(0)])
    b = script(0.01, [token(0, 1)], 0.003, [token(0, 2)], 0.003, [token(0, 3)], 0.1, [finished(0)])
    loop = asyncio.get_running_loop()

    async def second_message_time(source):
        stream = coalesced(source, policy)
        await stream.__anext__()
        await stream.__anext__()
        at = loop.time()
        await stream.aclose()
        return at

    policy.start()
    try:
        ta, tb = await asyncio.gather(second_message_time(a), second_message_time(b))
    finally:
        await policy.stop()
    assert abs(ta - tb) < 0.005, (ta, tb)


async def test_each_output_first_token_is_never_held():
    out = await regrouped(script([token(0, 1)], 0.005, [token(1, 7)], 0.005, [token(0, 2)], [token(1, 8)],
                                             [finished(0), finished(1)]), Fixed(10.0))
    assert shape(out)[:2] == [[("token", 0, [1], "a")], [("token", 1, [7], "g")]]
    assert shape(out)[2] == [("token", 0, [2], "b"), ("token", 1, [8], "h"), ("finished", 0, [], ""),
                             ("finished", 1, [], "")]


async def test_a_failure_after_held_deltas_sends_them_first():
    async def failing():
        yield [token(0, 1)]
        await asyncio.sleep(0.005)
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
            await asyncio.sleep(0.005)
            while True:
                yield [token(0, 2)]
                await asyncio.sleep(0.001)
        finally:
            state["closed"] = True

    policy = Fixed(0.05)
    policy.start()
    stream = coalesced(endless(), policy)
    assert shape([await stream.__anext__()]) == [[("token", 0, [1], "a")]]
    assert (await stream.__anext__())[0].token.tokens  # a held group arrives
    await stream.aclose()
    await policy.stop()
    assert state["closed"]


def test_budget_sets_the_spacing_from_the_engine_chunk_rate():
    counts = {"chunks": 0, "streams": 64}
    policy = MessageBudget(max_delay_s=0.02, budget_per_s=5000, chunks=lambda: counts["chunks"],
                           streams=lambda: counts["streams"], smoothing=1.0)
    policy.sample(0.0)
    counts["chunks"] = 400  # 4,000 chunks/s: under the budget, nothing is held
    policy.sample(0.1)
    assert policy.rate == pytest.approx(4000) and policy.spacing == 0.0
    counts["chunks"] += 800  # 8,000 chunks/s over 64 streams: each stream sends every 64/5000 s
    policy.sample(0.2)
    assert policy.spacing == pytest.approx(64 / 5000)
    counts["streams"] = 256  # 256/5000 s would exceed the bound on any token's extra delay
    counts["chunks"] += 800
    policy.sample(0.3)
    assert policy.spacing == 0.02
    policy.sample(0.4)  # the engine went quiet: at once again
    assert policy.spacing == 0.0
    counts["streams"] = 2  # two streams alone over the budget: 2/5000 s would tick 2,500 times a second
    counts["chunks"] += 1200
    policy.sample(0.5)
    assert policy.rate > 5000 and policy.spacing == MIN_TICK_S


@pytest.mark.parametrize("outputs", [1, 3])
async def test_end_to_end_same_tokens_fewer_messages(serve, monkeypatch, outputs):
    request = gen_request("hello", stopping={"max_tokens": 40}, sampling={"num_sequences": outputs, "seed": 7},
                          response={"return_output_logprobs": True, "output_candidates": {"top_n": 2}},
                          metadata={"fake.step_delay_ms": "4"})
    async with serve({"coalesce_max_delay_ms": 0}) as h:
        plain = check_generate_stream(request, await collect(h.stub, request, timeout=30))
    async with serve({"coalesce_max_delay_ms": 30}) as h:
        monkeypatch.setattr(h.service.coalescer, "sample", lambda now: None)  # over the budget, as set:
        h.service.coalescer.spacing = 0.03
        grouped = check_generate_stream(request, await collect(h.stub, request, timeout=30))
    assert grouped.token_ids == plain.token_ids and grouped.text == plain.text
    assert [[t.SerializeToString() for t in grouped.tokens[i]] for i in range(outputs)] == \
        [[t.SerializeToString() for t in plain.tokens[i]] for i in range(outputs)]
    assert grouped.usage == plain.usage
    assert grouped.messages < plain.messages * 0.6, (grouped.messages, plain.messages)


async def test_on_by_default_and_idle_under_the_budget(oe, serve):
    assert oe.service.coalescer.max_delay_s == 0.02 and oe.service.coalescer.budget_per_s == 10000
    out = await collect(oe.stub, gen_request("hi", stopping={"max_tokens": 5}), )
    assert [r.WhichOneof("event") for r in out] == ["token"] * 5 + ["finished"]
    async with serve({"coalesce_max_delay_ms": 0}) as h:
        assert h.service.coalescer is None


async def test_streams_group_their_tokens_once_the_engine_outruns_the_budget(serve):
    """Real sampling: eight streams of a 2 ms-per-step engine (~4,000 chunks/s) over a budget of
    200 messages/s: each stream's later messages carry several tokens, no token waits more than
    the 30 ms bound, and the stream contract holds."""
    request = gen_request("hello", stopping={"max_tokens": 120}, metadata={"fake.step_delay_ms": "2"})
    async with serve({"coalesce_max_delay_ms": 30, "coalesce_message_budget": 200}) as h:
        loop = asyncio.get_running_loop()

        async def one():
            arrivals = []
            async for r in h.stub.Generate(request, timeout=30):
                arrivals.append((loop.time(), r))
            return arrivals

        streams = await asyncio.gather(*(one() for _ in range(8)))
        assert h.service.coalescer.messages_saved > 0
    for arrivals in streams:
        out = check_generate_stream(request, [r for _, r in arrivals])
        assert len(out.token_ids[0]) == 120
        counts = [len(r.token.tokens) for _, r in arrivals if r.HasField("token")]
        assert counts[0] == 1 and max(counts) > 3, counts
        gaps = [b - a for (a, _), (b, _) in zip(arrivals, arrivals[1:], strict=False)]
        assert max(gaps) < 0.3, max(gaps)


def test_launchers_and_plugins_take_the_coalescing_settings(monkeypatch):
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    config = server_config_from_args(parser.parse_args(["--coalesce-max-delay-ms", "0",
                                                        "--coalesce-message-budget", "2500"]))
    assert (config.coalesce_max_delay_ms, config.coalesce_message_budget) == (0.0, 2500.0)
    monkeypatch.setenv("OE_TEST_PORT", "0")
    monkeypatch.setenv("OPENENGINE_COALESCE_MAX_DELAY_MS", "35")
    monkeypatch.setenv("OPENENGINE_COALESCE_MESSAGE_BUDGET", "4000")
    config = plugin_server_config("OE_TEST_PORT", "OE_TEST_HOST", "OE_TEST_MAX")
    assert (config.coalesce_max_delay_ms, config.coalesce_message_budget) == (35.0, 4000.0)
