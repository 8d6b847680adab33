"""Adaptive coalescing: fewer, fuller GenerateResponse messages only when the message rate is high.

One streamed gRPC message costs tens of microseconds of server CPU and as much again in the client,
whatever it holds (README "Performance"). A small model at high concurrency hands the front end a
token per stream per engine step, faster than one Python process can send one message each, and on
a host where the engine, the server and the client share cores every message also slows the engine.

The policy is a message budget (``MessageBudget``, one per server):

- one timer samples the rate at which the engine hands token chunks to the streams (the messages
  that would go out if nothing were grouped); while it stays at or under ``budget_per_s`` nothing
  is held, and every delta goes out at once, exactly as without coalescing;
- above it, each stream sends at most one token message per ``spacing`` = streams in flight /
  budget (so all streams together stay near the budget), never more than ``max_delay_s``: the
  bound on the extra delay any token sees, and never less than ``MIN_TICK_S``, so a few very
  fast streams cannot make the timer wake the loop thousands of times a second;
- a finish, an error, a prefill handoff, the prompt event and the first token of each output are
  never held: they flush what is pending and go out at once;
- while a stream waits for its next send time, a reader task keeps taking the engine's chunks, so
  the rate the budget sees is the engine's own, grouping cannot feed back into it, and a finish is
  seen the moment it comes; what gathered is merged token by token in order, so ids, text,
  logprobs and candidates are exactly those of the uncoalesced stream, only grouped;
- it composes with an engine's own ``--stream-interval``: that thins what the engine emits (and so
  the rate the budget sees), this thins what is sent, only above the budget.

A stream pays nothing for the policy until the budget is first exceeded while it runs: it reads
the engine directly and checks one attribute per chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from openengine_adapters.v1 import generation_pb2

GenerateResponse = generation_pb2.GenerateResponse

MIN_TICK_S = 0.001  # the shortest spacing: 1,000 ticks/s at most, whatever the streams and budget


class MessageBudget:
    """How far apart one stream's token messages must be now (``spacing``; 0 = send at once).

    ``chunks`` counts the engine chunks delivered to all streams so far, ``streams`` the requests
    in flight; both are read once per ``interval_s``.
    """

    def __init__(self, max_delay_s: float, budget_per_s: float, chunks: Callable[[], int],
                 streams: Callable[[], int], interval_s: float = 0.05, smoothing: float = 0.5) -> None:
        self.max_delay_s = max_delay_s
        self.budget_per_s = budget_per_s
        self.chunks = chunks
        self.streams = streams
        self.interval_s = interval_s
        self.smoothing = smoothing
        self.rate = 0.0  # engine chunks per second, smoothed
        self.spacing = 0.0
        self.messages_saved = 0  # token messages merged away (the metrics show it)
        self._last: tuple[float, int] | None = None
        self._waiting: list[asyncio.Event] = []  # streams holding tokens until the next tick
        self._task: asyncio.Task | None = None

    def sample(self, now: float) -> None:
        """Update the chunk rate and the spacing from the counters at time ``now``."""
        count = self.chunks()
        if self._last is not None and now > self._last[0]:
            rate = (count - self._last[1]) / (now - self._last[0])
            self.rate += self.smoothing * (rate - self.rate)
        self._last = (now, count)
        if self.rate <= self.budget_per_s:
            self.spacing = 0.0
        else:
            self.spacing = min(self.max_delay_s, max(MIN_TICK_S, self.streams() / self.budget_per_s))

    def wait_for_tick(self, flush: asyncio.Event) -> None:
        """Set ``flush`` at the next tick (or at once when nothing is held any more)."""
        if self.spacing > 0:
            self._waiting.append(flush)
        else:
            flush.set()

    def tick(self) -> None:
        """Every waiting stream flushes now: together, so their messages leave in one burst."""
        waiting, self._waiting = self._waiting, []
        for flush in waiting:
            flush.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.tick()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sample = 0.0
        while True:
            now = loop.time()
            if now >= next_sample:
                self.sample(now)
                next_sample = now + self.interval_s
            self.tick()
            await asyncio.sleep(self.spacing or self.interval_s)


def _urgent(batch: list[GenerateResponse], started: set[int]) -> bool:
    """Whether a batch holds a response that is never held: anything but a token delta, or an
    output's first token (each output's first token is noted in ``started``)."""
    urgent = False
    for resp in batch:
        if resp.WhichOneof("event") != "token":
            urgent = True
        elif (index := resp.token.output_index) not in started:
            started.add(index)
            urgent = True
    return urgent


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


async def coalesced(responses: AsyncIterator[list[GenerateResponse]], policy: MessageBudget
                    ) -> AsyncIterator[list[GenerateResponse]]:
    """``responses`` (one list per engine chunk) regrouped by ``policy``: lists to send now, in order.

    While the policy's spacing is 0 each list is passed on as it comes. Once it is not, a reader
    task takes over the engine side for the rest of the stream, and what it gathers is sent at the
    policy's next tick, or at once for an urgent response, the end or a failure.
    """
    iterator = responses.__aiter__()
    started: set[int] = set()
    while policy.spacing <= 0:  # direct: as without coalescing
        try:
            batch = await iterator.__anext__()
        except StopAsyncIteration:
            return
        _urgent(batch, started)  # notes each output's first token
        yield batch

    held: list[GenerateResponse] = []
    arrived = asyncio.Event()  # anything new (or the end)
    flush = asyncio.Event()  # the tick, an urgent response or the end: send what is held
    state: dict = {"done": False, "error": None}

    async def read() -> None:
        try:
            while True:
                batch = await iterator.__anext__()
                held.extend(batch)
                if _urgent(batch, started):
                    flush.set()
                arrived.set()
        except StopAsyncIteration:
            pass
        except Exception as exc:  # the sender raises it after what was read is sent
            state["error"] = exc
        finally:
            state["done"] = True
            flush.set()
            arrived.set()

    reader = asyncio.ensure_future(read())
    try:
        while True:
            while not held and not state["done"]:
                arrived.clear()
                await arrived.wait()
            if held and not flush.is_set():
                policy.wait_for_tick(flush)
                await flush.wait()
            flush.clear()
            if held:
                out = held[:]
                held.clear()
                merged = merge(out)
                policy.messages_saved += len(out) - len(merged)
                yield merged
            elif state["done"]:
                if state["error"] is not None:
                    raise state["error"]
                return
    finally:
        if not reader.done():
            reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
