"""Adaptive coalescing: fewer, fuller GenerateResponse messages only when the server falls behind.

One streamed gRPC message costs tens of microseconds of server CPU and as much again in the client,
whatever it holds (README "Performance"). When the event loop keeps up, every engine delta goes
out at once, exactly as without coalescing. When it falls behind, shown by the loop's own
scheduling lag, a stream that has sent its first token holds further token deltas for a short
window and sends what gathered as one message per output:

- the window is the measured lag (a loop that is late by L is already delaying every message by
  about L), doubled, and never more than ``max_delay_s``: the bound on the extra delay any token
  sees; with fewer than four streams in flight nothing is held, since so few cannot be what
  slows the loop;
- a finish, an error, a prefill handoff, the prompt event and the first token of each output are
  never held: they flush what is pending and go out at once;
- while a stream holds, the engine keeps producing: vLLM's output collector merges deltas that
  were not yet read, and whatever chunks arrive are merged here, token by token in order, so ids,
  text, logprobs and candidates are exactly those of the uncoalesced stream, only grouped;
- it composes with an engine's own ``--stream-interval``: that thins what the engine emits, this
  thins what is sent, only under load.

The lag is sampled by one timer per server (``LoopLag``), not per stream, so the idle per-token
path pays one attribute read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from openengine_adapters.v1 import generation_pb2

GenerateResponse = generation_pb2.GenerateResponse


class LoopLag:
    """The event loop's scheduling lag, sampled every ``interval_s`` and smoothed."""

    def __init__(self, interval_s: float = 0.005, threshold_s: float = 0.002, smoothing: float = 0.3) -> None:
        self.interval_s = interval_s
        self.threshold_s = threshold_s
        self.smoothing = smoothing
        self.lag_s = 0.0
        self._task: asyncio.Task | None = None

    @property
    def behind(self) -> bool:
        return self.lag_s > self.threshold_s

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            late = max(0.0, loop.time() - start - self.interval_s)
            self.lag_s += self.smoothing * (late - self.lag_s)


class Coalescer:
    """The policy one server applies to every Generate stream.

    ``streams`` counts the requests in flight: with fewer than ``min_streams`` the message rate
    cannot be what holds the server back (a late loop then means CPU taken by others, e.g. the
    engine's busy-polling processes), so nothing is held.
    """

    def __init__(self, lag: LoopLag, max_delay_s: float = 0.02, streams: Callable[[], int] | None = None,
                 min_streams: int = 4) -> None:
        self.lag = lag
        self.max_delay_s = max_delay_s
        self.streams = streams
        self.min_streams = min_streams
        self.messages_saved = 0  # token messages merged away (the metrics show it)

    def window(self) -> float:
        """How long a stream may hold token deltas now; 0 when the loop keeps up."""
        if not self.lag.behind or (self.streams is not None and self.streams() < self.min_streams):
            return 0.0
        return min(self.max_delay_s, 2 * self.lag.lag_s)


def _urgent(resp: GenerateResponse, started: set[int]) -> bool:
    """Responses that are never held: anything but a token delta, and each output's first token."""
    if resp.WhichOneof("event") != "token":
        return True
    index = resp.token.output_index
    if index not in started:
        started.add(index)
        return True
    return False


def merge(held: list[GenerateResponse]) -> list[GenerateResponse]:
    """Held responses with each output's token deltas joined into its first one (tokens and text
    in order). Token events are output-scoped, so outputs may interleave differently; within an
    output the order is kept, and its finish still follows its tokens."""
    out: list[GenerateResponse] = []
    first: dict[int, GenerateResponse] = {}
    for resp in held:
        if resp.WhichOneof("event") == "token":
            index = resp.token.output_index
            head = first.get(index)
            if head is not None:
                head.token.tokens.extend(resp.token.tokens)
                head.token.text += resp.token.text
                continue
            first[index] = resp
        out.append(resp)
    return out


async def coalesced(responses: AsyncIterator[list[GenerateResponse]], policy: Coalescer
                    ) -> AsyncIterator[list[GenerateResponse]]:
    """``responses`` (one list per engine chunk) regrouped by ``policy``: lists to send now, in order.

    Idle path: each list is passed on as it comes. Under load, token deltas are held up to the
    window; the next chunk is then awaited in a task so a finish or error ends the hold at once.
    """
    iterator = responses.__aiter__()
    started: set[int] = set()
    held: list[GenerateResponse] = []
    deadline = 0.0
    pending: asyncio.Future | None = None
    try:
        while True:
            if not held:
                try:
                    if pending is not None:  # a read begun while holding is still under way
                        task, pending = pending, None
                        batch = await task
                    else:
                        batch = await iterator.__anext__()
                except StopAsyncIteration:
                    return
            else:
                if pending is None:
                    pending = asyncio.ensure_future(iterator.__anext__())
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    await asyncio.wait((pending,), timeout=remaining)
                if not pending.done():  # the window closed first: send what gathered
                    merged = merge(held)
                    policy.messages_saved += len(held) - len(merged)
                    held = []
                    yield merged
                    continue
                task, pending = pending, None
                try:
                    batch = task.result()
                except StopAsyncIteration:
                    yield merge(held)
                    return
                except BaseException:
                    yield merge(held)  # what was streamed stays streamed; then the failure ends it
                    raise
            if [r for r in batch if _urgent(r, started)]:  # every response looked at: first tokens noted
                if held:
                    merged = merge(held + batch)
                    policy.messages_saved += len(held) + len(batch) - len(merged)
                    held = []
                    yield merged
                else:
                    yield batch
                continue
            window = policy.window() if not held else deadline - time.monotonic()
            if not held and window <= 0:
                yield batch
                continue
            if not held:
                deadline = time.monotonic() + window
            held.extend(batch)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
