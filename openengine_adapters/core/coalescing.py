"""Adaptive coalescing: fewer, fuller GenerateResponse messages only while the front end is the cost.

One streamed gRPC message costs tens of microseconds of server CPU and as much again in the client,
whatever it holds (docs/performance.md). A small model at high concurrency hands the front end a
token per stream per engine step, faster than one Python process can send one message each, and on
a host where the engine, the server and the client share cores every message also slows the engine.

The policy reads the server's own load (``GroupingPolicy``, one per server), not a message rate: a
fixed rate is wrong on every machine but one. Every ``interval_s`` it reads

- the CPU time of the event loop's thread (``time.thread_time`` on the loop: every stream's Python
  work runs there, the engine's output handling in the same process included), as a share of a core;
- how late its own timer woke (the loop's lag: what a backlog of writes and callbacks shows up as).

The loop is busy when it uses ``loop_cpu_share`` of a core or more (``--coalesce-loop-cpu``, default
0.5; 0 = always), or when its timer wakes ``LAG_S`` late while it uses at least half of that (it is
behind its own work, not merely kept off the CPU while idle). While busy the spacing doubles at every
reading, from ``MIN_TICK_S`` up to ``max_delay_s``, the bound on any token's extra delay; at every
other reading it halves, back to sending every token at once. (A band that held the spacing between
half the threshold and the threshold kept 16 streams of the tiny vLLM model grouped after one lag
spike, their loop at 0.42-0.46 of a core: inter-token p99 1.85x that of coalescing off.)
Each stream then sends at most one token message per ``spacing``:

- a finish, an error, a prefill handoff, the prompt event and the first token of each output are
  never held: they flush what is pending and go out at once;
- while a stream waits for its next send time, a reader task keeps taking the engine's chunks, so a
  finish is seen the moment it comes; what gathered is merged token by token in order, so ids, text,
  logprobs and candidates are exactly those of the uncoalesced stream, only grouped. At most
  ``HELD_MAX`` responses are held: then they go at once and the engine is read on only once they
  are taken, so a client that does not read holds the engine back as it does ungrouped;
- it composes with an engine's own ``--stream-interval``: that thins what the engine emits, this
  thins what is sent, only while the loop is busy.

A stream pays nothing for the policy while the loop is not busy: it reads the engine directly and
checks one attribute per chunk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from openengine_adapters.v1 import generation_pb2

GenerateResponse = generation_pb2.GenerateResponse

MIN_TICK_S = 0.001  # the shortest spacing: 1,000 ticks/s at most
LAG_S = 0.005  # a timer this late, with the loop at least half busy: behind its own work
HELD_MAX = 256  # responses one stream holds at most before they go, whatever the spacing


class GroupingPolicy:
    """How far apart one stream's token messages must be now (``spacing``; 0 = send at once), from the
    event loop's own load. ``cpu_clock`` is the loop thread's CPU time (read on the loop)."""

    def __init__(self, max_delay_s: float, loop_cpu_share: float, interval_s: float = 0.05,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self.max_delay_s = max_delay_s
        self.loop_cpu_share = loop_cpu_share
        self.interval_s = interval_s
        self.cpu_clock = cpu_clock
        self.cpu_share = 0.0  # of a core, over the last interval (the metrics show it)
        self.spacing = 0.0
        self.messages_saved = 0  # token messages merged away (the metrics show it)
        self._last: tuple[float, float] | None = None
        self._waiting: list[asyncio.Event] = []  # streams holding tokens until the next tick
        self._task: asyncio.Task | None = None

    def sample(self, now: float, lag_s: float = 0.0) -> None:
        """Update the loop's CPU share and the spacing at time ``now``; ``lag_s``: how late the timer
        woke at worst since the last reading."""
        cpu = self.cpu_clock()
        last, self._last = self._last, (now, cpu)
        if last is None or now <= last[0]:
            return  # the first reading starts the clock
        self.cpu_share = (cpu - last[1]) / (now - last[0])
        threshold, share = self.loop_cpu_share, self.cpu_share
        if share >= threshold or (lag_s >= LAG_S and share >= threshold / 2):
            self.spacing = min(self.max_delay_s, max(MIN_TICK_S, self.spacing * 2))
        else:  # no band that holds it: a lag spike at a load just under the threshold must not keep it
            self.spacing = self.spacing / 2 if self.spacing / 2 >= MIN_TICK_S else 0.0

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
        self.spacing = 0.0
        self.tick()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self.sample(loop.time())
        next_sample, lag = loop.time() + self.interval_s, 0.0
        while True:
            due = loop.time() + (self.spacing or self.interval_s)
            await asyncio.sleep(self.spacing or self.interval_s)
            now = loop.time()
            lag = max(lag, now - due)
            if now >= next_sample:
                self.sample(now, lag)
                next_sample, lag = now + self.interval_s, 0.0
            self.tick()


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
    in order; the text joined once, not copied per delta). Token events are output-scoped, so
    outputs may interleave differently; within an output the order is kept, and its finish still
    follows its tokens."""
    out: list[GenerateResponse] = []
    first: dict[int, GenerateResponse] = {}
    texts: dict[int, list[str]] = {}
    for resp in held:
        if resp.WhichOneof("event") == "token":
            index = resp.token.output_index
            head = first.get(index)
            if head is not None:
                head.token.tokens.extend(resp.token.tokens)
                texts[index].append(resp.token.text)
                continue
            first[index] = resp
            texts[index] = [resp.token.text]
        out.append(resp)
    for index, parts in texts.items():
        if len(parts) > 1:
            first[index].token.text = "".join(parts)
    return out


async def coalesced(responses: AsyncIterator[list[GenerateResponse]], policy: GroupingPolicy
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
    flush = asyncio.Event()  # the tick, an urgent response, HELD_MAX or the end: send what is held
    taken = asyncio.Event()  # the sender took what was held
    state: dict = {"done": False, "error": None}

    async def read() -> None:
        try:
            while True:
                batch = await iterator.__anext__()
                held.extend(batch)
                full = len(held) >= HELD_MAX
                if _urgent(batch, started) or full:
                    flush.set()
                arrived.set()
                if full:  # the engine is read on once the client has taken these
                    taken.clear()
                    await taken.wait()
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
                taken.set()  # written: the reader may take more
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
