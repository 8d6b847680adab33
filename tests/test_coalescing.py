"""Adaptive coalescing (core.coalescing): only the grouping of token deltas into messages changes.

Pure tests of the regrouping on scripted sources, then end to end over gRPC on the fake engine with
the server forced behind: the stream contract holds and ids, text and logprobs equal the
uncoalesced stream's, in fewer messages.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest
from helpers import collect, gen_request
from stream_contract import check_generate_stream

from openengine_adapters.core.coalescing import HELD_MAX, LAG_S, MIN_TICK_S, GroupingPolicy, coalesced, merge
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


class Fixed(GroupingPolicy):
    """A policy whose spacing is set by the test (the loop busy or not); it ticks while a test's
    ``coalesced`` runs."""

    def __init__(self, spacing: float) -> None:
        super().__init__(max_delay_s=spacing, loop_cpu_share=0.5)
        self.spacing = spacing

    def sample(self, now: float, lag_s: float = 0.0) -> None:
        pass


async def regrouped(source, policy: GroupingPolicy, timed: bool = False) -> list:
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


def test_the_loops_own_load_sets_the_spacing():
    """The loop's CPU share, read from an injected clock: at 20% of a core nothing is held; at 60% the
    spacing doubles each reading up to the bound; under the threshold it halves back to sending at once
    (at 45% too: a loop just under it is not held grouped)."""
    cpu = {"s": 0.0}
    policy = GroupingPolicy(max_delay_s=0.02, loop_cpu_share=0.5, cpu_clock=lambda: cpu["s"])
    now = 0.0

    def reading(share: float, lag_s: float = 0.0) -> float:
        nonlocal now
        now += 0.1
        cpu["s"] += share * 0.1
        policy.sample(now, lag_s)
        return policy.spacing

    policy.sample(now)
    assert reading(0.2) == 0.0 and policy.cpu_share == pytest.approx(0.2)
    assert [reading(0.6) for _ in range(7)] == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016, 0.02, 0.02])
    assert reading(0.45) == 0.01  # just under the threshold: halved, not held
    assert [reading(0.1) for _ in range(5)] == pytest.approx([0.005, 0.0025, 0.00125, 0.0, 0.0])
    # lag counts only while the loop is at least half busy: late but idle is a loop kept off the CPU
    assert reading(0.1, lag_s=LAG_S * 4) == 0.0
    assert reading(0.3, lag_s=LAG_S) == MIN_TICK_S
    always = GroupingPolicy(max_delay_s=0.02, loop_cpu_share=0.0, cpu_clock=lambda: 0.0)
    always.sample(0.0)  # the first call only starts the clock
    assert always.spacing == 0.0
    always.sample(0.1)
    assert always.spacing == MIN_TICK_S  # a threshold of 0 always groups


async def test_the_timer_measures_the_loops_lag():
    """A loop busy for 30 ms in one callback: the policy's timer wakes that late, and the reading
    after it sees the lag (and the CPU the callback used)."""
    seen = []
    policy = GroupingPolicy(max_delay_s=0.02, loop_cpu_share=0.9, interval_s=0.01)
    policy.sample = lambda now, lag_s=0.0: seen.append((policy.cpu_clock(), lag_s))
    policy.start()
    try:
        await asyncio.sleep(0.02)
        end = time.monotonic() + 0.03
        while time.monotonic() < end:  # the loop's thread busy: no callback runs
            pass
        await asyncio.sleep(0.03)
    finally:
        await policy.stop()
    assert max(lag for _, lag in seen) >= 0.015, seen


@pytest.mark.parametrize("outputs", [1, 3])
async def test_end_to_end_same_tokens_fewer_messages(serve, monkeypatch, outputs):
    request = gen_request("hello", stopping={"max_tokens": 40}, sampling={"num_sequences": outputs, "seed": 7},
                          response={"return_output_logprobs": True, "output_candidates": {"top_n": 2}},
                          metadata={"fake.step_delay_ms": "4"})
    async with serve({"coalesce_max_delay_ms": 0}) as h:
        plain = check_generate_stream(request, await collect(h.stub, request, timeout=30))
    async with serve({"coalesce_max_delay_ms": 30}) as h:
        monkeypatch.setattr(h.service.coalescer, "sample", lambda now, lag_s=0.0: None)  # busy, as set:
        h.service.coalescer.spacing = 0.03
        grouped = check_generate_stream(request, await collect(h.stub, request, timeout=30))
    assert grouped.token_ids == plain.token_ids and grouped.text == plain.text
    assert [[t.SerializeToString() for t in grouped.tokens[i]] for i in range(outputs)] == \
        [[t.SerializeToString() for t in plain.tokens[i]] for i in range(outputs)]
    assert grouped.usage == plain.usage
    assert grouped.messages < plain.messages * 0.6, (grouped.messages, plain.messages)


async def test_on_by_default_and_idle_while_the_loop_is_not_busy(oe, serve):
    assert oe.service.coalescer.max_delay_s == 0.02 and oe.service.coalescer.loop_cpu_share == 0.5
    out = await collect(oe.stub, gen_request("hi", stopping={"max_tokens": 5}), )
    assert [r.WhichOneof("event") for r in out] == ["token"] * 5 + ["finished"]
    async with serve({"coalesce_max_delay_ms": 0}) as h:
        assert h.service.coalescer is None


async def test_streams_group_their_tokens_while_the_loop_is_busy(serve):
    """The policy's own timer, readings and ticks: eight streams of a 2 ms-per-step engine with a
    threshold of 0 (the loop always busy): each stream's later messages carry several tokens, no token
    waits more than the 30 ms bound, and the stream contract holds."""
    request = gen_request("hello", stopping={"max_tokens": 120}, metadata={"fake.step_delay_ms": "2"})
    async with serve({"coalesce_max_delay_ms": 30, "coalesce_loop_cpu": 0}) as h:
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
                                                        "--coalesce-loop-cpu", "0.25"]))
    assert (config.coalesce_max_delay_ms, config.coalesce_loop_cpu) == (0.0, 0.25)
    with pytest.raises(SystemExit):  # more than a whole core: refused when parsed
        server_config_from_args(parser.parse_args(["--coalesce-loop-cpu", "2"]))
    monkeypatch.setenv("OE_TEST_PORT", "0")
    monkeypatch.setenv("OPENENGINE_COALESCE_MAX_DELAY_MS", "35")
    monkeypatch.setenv("OPENENGINE_COALESCE_LOOP_CPU", "0.75")
    config = plugin_server_config("OE_TEST_PORT", "OE_TEST_HOST", "OE_TEST_MAX")
    assert (config.coalesce_max_delay_ms, config.coalesce_loop_cpu) == (35.0, 0.75)


async def test_a_stream_whose_client_does_not_read_holds_the_engine_back():
    """Held responses are bounded: at HELD_MAX they go, and the engine is read on only once the
    consumer took them, so a client that reads nothing holds the engine back as it does ungrouped
    (the reader did not stop before: a frozen client's stream read the engine's whole output)."""
    pulled = {"n": 0}

    async def engine():
        yield [token(0, 1)]
        while True:
            pulled["n"] += 1
            yield [token(0, 2)]
            await asyncio.sleep(0)

    policy = Fixed(10.0)  # never ticks: only HELD_MAX makes held tokens go
    stream = coalesced(engine(), policy)
    assert (await stream.__anext__())[0].token.tokens[0].token_id == 1  # the first token at once
    second = await asyncio.wait_for(stream.__anext__(), 5)
    assert len(second[0].token.tokens) == HELD_MAX
    await asyncio.sleep(0.2)  # the consumer takes nothing more: neither does the reader
    assert pulled["n"] <= HELD_MAX + 2, pulled
    await stream.aclose()
