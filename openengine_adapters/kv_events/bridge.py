"""``KvEventBridge``: engine-native ZMQ KV-event publishers -> typed ``KvEventBatchData`` streams.

One ZMQ SUB socket per data-parallel rank reads ``[topic, seq (8-byte BE), msgpack]`` frames
(connecting to a publisher that binds, binding where the publisher connects). Each batch is
decoded, applied to the rank's live block set (hash -> ``BlockStored``), kept in a bounded ring
for replay and published to an ``EventHub`` (bounded per-subscriber queues; a stalled subscriber
is cut off with a retryable OVERLOADED error, the others are unaffected).

Sequence numbers are the publisher's, per rank. A jump in them is a gap: it is filled from the
engine's replay socket (DEALER ``[b"", start]`` -> ``[b"", topic, seq, payload]``... then
``[b"", -1, b""]``); what the engine no longer has is healed with a synthesized batch holding one
``AllBlocksCleared`` (numbered with the last missing sequence number) so that consumers drop
state that may be stale: a gap is never skipped silently. An undecodable payload is healed the
same way under its own number.

Engines without a publisher (TensorRT-LLM's polled event queue) feed the same machinery through
``KvEventBridge.polled(ranks)`` and ``publish``: typed batches, numbered here per rank from 1.

``subscribe`` delivers history then live with no gap and no duplicate: it joins the hub first,
captures the ring / live set synchronously, replays (ring, and the engine's replay socket for
what the ring no longer holds) and then drops live batches already delivered. With
``include_snapshot`` it sends, per rank, ``AllBlocksCleared`` plus one ``BlockStored`` per live
block (in chunks, every chunk numbered with the last sequence number the snapshot reflects, 0
before any batch) and then live batches after it; ``start_sequence_number`` is then ignored, as
replaying history on top of a snapshot would corrupt it. ``start_sequence_number`` 0 means live
only. If history from ``start_sequence_number`` is no longer available anywhere, the rank falls
back to a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable, Sequence

import zmq
import zmq.asyncio

from openengine_adapters.backend import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatchData,
    KvEventData,
)
from openengine_adapters.errors import EngineFailure, invalid
from openengine_adapters.event_hub import EventHub
from openengine_adapters.kv_events.msgpack_decoding import DecodeError, DecodeStats, decode_batch
from openengine_adapters.kv_events.sources import PublisherConfig, local_address, publisher_binds
from openengine_adapters.types import ErrorCode, StorageMedium

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_BlockKey = tuple[StorageMedium, int, bytes, str]


def split_blocks(ev: BlockStored) -> list[BlockStored]:
    """One ``BlockStored`` per block of a (chained, multi-block) store event."""
    n = len(ev.block_hashes)
    if n <= 1:
        return [ev] if n else []
    toks, bs = ev.token_ids, ev.block_size
    if bs and len(toks) == n * bs:
        per = bs
    elif toks and len(toks) % n == 0:
        per = len(toks) // n
    else:
        per = 0
    keys = ev.extra_keys if len(ev.extra_keys) == n else None
    out, parent = [], ev.parent_block_hash
    for i, h in enumerate(ev.block_hashes):
        out.append(BlockStored(
            block_hashes=(h,), parent_block_hash=parent, token_ids=toks[i * per:(i + 1) * per] if per else (),
            block_size=ev.block_size, lora_id=ev.lora_id, lora_name=ev.lora_name, medium=ev.medium,
            extra_keys=(keys[i],) if keys is not None else (), group_idx=ev.group_idx,
            kv_cache_spec_kind=ev.kv_cache_spec_kind, kv_cache_spec_sliding_window=ev.kv_cache_spec_sliding_window))
        parent = h
    return out


class _Rank:
    __slots__ = ("pub", "rank", "topic", "sub", "ring", "blocks", "last_seq", "address", "binds", "replay_address")

    def __init__(self, rank: int, pub: PublisherConfig | None, ring_size: int) -> None:
        self.pub = pub  # None: batches arrive through ``KvEventBridge.publish``
        self.rank = rank
        self.topic = pub.topic.encode("utf-8") if pub else b""
        self.binds = publisher_binds(pub.endpoint) if pub else False
        self.address = (local_address(pub.endpoint) if self.binds else pub.endpoint) if pub else None
        self.replay_address = local_address(pub.replay_endpoint) if pub and pub.replay_endpoint else None
        self.sub: zmq.asyncio.Socket | None = None
        self.ring: deque[KvEventBatchData] = deque(maxlen=ring_size)
        self.blocks: dict[_BlockKey, BlockStored] = {}
        self.last_seq = -1


class KvEventBridge:
    def __init__(self, publishers: Iterable[PublisherConfig], *, ring_size: int = 1024,
                 subscriber_queue: int = 4096, max_live_blocks: int = 1 << 20, replay_timeout_s: float = 2.0,
                 snapshot_chunk: int = 256, max_rcvhwm: int = 100_000) -> None:
        self._ranks: dict[int, _Rank] = {}
        for pub in publishers:
            if pub.data_parallel_rank in self._ranks:
                raise ValueError(f"two KV-event publishers for rank {pub.data_parallel_rank}")
            self._ranks[pub.data_parallel_rank] = _Rank(pub.data_parallel_rank, pub, ring_size)
        self.hub: EventHub[KvEventBatchData] = EventHub(subscriber_queue)
        self.stats = DecodeStats()
        self.counters: Counter[str] = Counter()
        self.max_live_blocks = max_live_blocks
        self.replay_timeout_s = replay_timeout_s
        self.snapshot_chunk = max(1, snapshot_chunk)
        self.max_rcvhwm = max_rcvhwm
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task] = []
        self._failure: EngineFailure | None = None
        self._closed = False

    @classmethod
    def polled(cls, ranks: Iterable[int], *, ring_size: int = 1024, **kw) -> KvEventBridge:
        """A bridge with no publisher socket (never ``start``ed): its owner reads the engine and
        calls ``publish``; ``stop`` still ends the subscriptions."""
        bridge = cls((), ring_size=ring_size, **kw)
        for r in ranks:
            bridge._ranks[r] = _Rank(r, None, ring_size)
        return bridge

    def publish(self, rank: int, events: Sequence[KvEventData]) -> None:
        """One typed batch for ``rank``, numbered after the rank's last one (from 1)."""
        st = self._ranks[rank]
        self._apply(st, KvEventBatchData(max(st.last_seq, 0) + 1, time.time_ns(), rank, tuple(events)))

    @property
    def ranks(self) -> list[int]:
        return sorted(self._ranks)

    def live_blocks(self, rank: int) -> list[BlockStored]:
        return list(self._ranks[rank].blocks.values())

    def last_sequence_number(self, rank: int) -> int:
        return self._ranks[rank].last_seq

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the SUB sockets, catch up on the engine's buffered history, then read live."""
        self._ctx = zmq.asyncio.Context()
        for st in self._ranks.values():
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, min(st.pub.hwm or self.max_rcvhwm, self.max_rcvhwm))
            sock.setsockopt(zmq.SUBSCRIBE, st.topic)
            if st.binds:
                sock.connect(st.address)
            else:
                sock.bind(st.address)
            st.sub = sock
        for st in self._ranks.values():
            await self._catch_up(st, None)
        self._tasks = [asyncio.create_task(self._read(st), name=f"kv-events-rank{st.rank}")
                       for st in self._ranks.values()]

    async def stop(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.hub.close(EngineFailure(ErrorCode.DRAINING, "the engine is shutting down", retryable=True))
        for st in self._ranks.values():
            if st.sub is not None:
                st.sub.close(linger=0)
                st.sub = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    # ------------------------------------------------------------------ ingest

    async def _read(self, st: _Rank) -> None:
        try:
            while True:
                frames = await st.sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.counters["malformed_frames"] += 1
                    continue
                topic, seq_bytes, payload = frames
                if topic != st.topic:
                    continue
                await self._ingest(st, int.from_bytes(seq_bytes, "big"), payload)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("KV-event reader of rank %d failed", st.rank)
            self._failure = EngineFailure(ErrorCode.INTERNAL, f"KV-event reader of rank {st.rank} failed: {exc}")
            self.hub.close(self._failure)

    async def _ingest(self, st: _Rank, seq: int, payload: bytes) -> None:
        if seq <= st.last_seq:
            self.counters["duplicates"] += 1
            return
        if seq > st.last_seq + 1:
            self.counters["gaps"] += 1
            log.info("KV events rank %d: sequence gap %d..%d, replaying", st.rank, st.last_seq + 1, seq - 1)
            await self._catch_up(st, seq)
            if seq <= st.last_seq:
                return
            if seq > st.last_seq + 1:
                self._heal(st, seq - 1)
        self._apply_raw(st, seq, payload)

    async def _catch_up(self, st: _Rank, until: int | None) -> None:
        """Apply what the engine's replay buffer holds after ``last_seq`` (up to ``until``)."""
        async with contextlib.aclosing(self._replay(st, st.last_seq + 1)) as replay:
            async for seq, payload in replay:
                if until is not None and seq >= until:
                    break
                if seq <= st.last_seq:
                    continue
                if seq > st.last_seq + 1:
                    self._heal(st, seq - 1)
                self.counters["replayed"] += 1
                self._apply_raw(st, seq, payload)

    def _apply_raw(self, st: _Rank, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload, seq, st.rank, self.stats)
        except DecodeError as exc:
            self.counters["undecodable"] += 1
            log.warning("KV events rank %d: batch %d is undecodable (%s); healing", st.rank, seq, exc)
            self._heal(st, seq)
            return
        self._apply(st, batch)

    def _heal(self, st: _Rank, seq: int) -> None:
        """Events up to ``seq`` are lost: tell consumers to drop state (the engine cannot re-send it)."""
        self.counters["healed_by_clear"] += 1
        log.warning("KV events rank %d: events before %d are lost; publishing AllBlocksCleared", st.rank, seq + 1)
        self._apply(st, KvEventBatchData(seq, time.time_ns(), st.rank, (KvEventData(AllBlocksCleared()),)))

    def _apply(self, st: _Rank, batch: KvEventBatchData) -> None:
        blocks = st.blocks
        for item in batch.events:
            ev = item.event
            if isinstance(ev, BlockStored):
                for blk in split_blocks(ev):
                    h = blk.block_hashes[0]
                    key = (blk.medium, blk.group_idx, h.value, h.encoding)
                    blocks.pop(key, None)
                    blocks[key] = blk
                while len(blocks) > self.max_live_blocks:
                    del blocks[next(iter(blocks))]
                    self.counters["evicted_live_blocks"] += 1
            elif isinstance(ev, BlockRemoved):
                media = (ev.medium,) if ev.medium != StorageMedium.UNSPECIFIED else tuple(StorageMedium)
                for h in ev.block_hashes:
                    for m in media:
                        blocks.pop((m, ev.group_idx, h.value, h.encoding), None)
            elif isinstance(ev, AllBlocksCleared):
                blocks.clear()
        st.last_seq = batch.sequence_number
        st.ring.append(batch)
        self.hub.publish(batch)

    async def _replay(self, st: _Rank, start: int) -> AsyncIterator[tuple[int, bytes]]:
        """``(seq, payload)`` of the engine's buffered batches from ``start`` (nothing without a replay socket)."""
        if st.replay_address is None or self._ctx is None:
            return
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, min((st.pub.buffer_steps or 10_000) + 16, self.max_rcvhwm))
        try:
            sock.connect(st.replay_address)
            await sock.send_multipart([b"", max(start, 0).to_bytes(8, "big")])
            while True:
                if not await sock.poll(int(self.replay_timeout_s * 1000), zmq.POLLIN):
                    self.counters["replay_timeouts"] += 1
                    return
                frames = await sock.recv_multipart()
                if len(frames) != 4 or frames[0] != b"" or len(frames[2]) != 8:
                    self.counters["malformed_frames"] += 1
                    continue
                _, topic, seq_bytes, payload = frames
                if seq_bytes == END_SEQ:
                    return
                if topic == st.topic:
                    yield int.from_bytes(seq_bytes, "big"), payload
        finally:
            sock.close(linger=0)

    # ------------------------------------------------------------------ subscribers

    def snapshot(self, rank: int) -> list[KvEventBatchData]:
        """``AllBlocksCleared`` + one ``BlockStored`` per live block, chunked, as of ``last_seq``."""
        st = self._ranks[rank]
        seq, now = max(st.last_seq, 0), time.time_ns()
        events = [KvEventData(AllBlocksCleared())] + [KvEventData(b) for b in st.blocks.values()]
        return [KvEventBatchData(seq, now, rank, tuple(events[i:i + self.snapshot_chunk]))
                for i in range(0, len(events), self.snapshot_chunk)]

    def subscribe(self, ranks: Sequence[int], include_snapshot: bool,
                  start_sequence_number: int) -> AsyncIterator[KvEventBatchData]:
        """History (or a snapshot) then live; raises ``RequestRejected`` for an unknown rank."""
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise EngineFailure(ErrorCode.DRAINING, "the engine is shutting down", retryable=True)
        wanted = sorted(set(ranks)) if ranks else sorted(self._ranks)
        unknown = [r for r in wanted if r not in self._ranks]
        if unknown:
            raise invalid(f"data_parallel_ranks: no KV events for rank(s) {unknown}; "
                          f"ranks with KV events are {sorted(self._ranks)}")
        return self._stream(wanted, include_snapshot, start_sequence_number)

    async def _stream(self, ranks: list[int], include_snapshot: bool, start: int) -> AsyncIterator[KvEventBatchData]:
        wanted = frozenset(ranks)
        sub = self.hub.subscribe(lambda b: b.data_parallel_rank in wanted)
        live = None
        try:
            # Captured synchronously with joining the hub: everything after this is in ``sub``.
            floor: dict[int, int] = {}
            plans: dict[int, tuple[str, list[KvEventBatchData]]] = {}
            for r in ranks:
                st = self._ranks[r]
                floor[r] = st.last_seq
                if include_snapshot:
                    plans[r] = ("snapshot", self.snapshot(r))
                elif start > 0:
                    plans[r] = ("history", list(st.ring))
            for r in ranks:
                kind, items = plans.get(r, ("", []))
                if kind == "snapshot":
                    for b in items:
                        yield b
                elif kind == "history":
                    if start > floor[r]:
                        floor[r] = start - 1  # a start in the future: deliver from there
                        continue
                    async for b in self._history(self._ranks[r], start, items, floor):
                        yield b
            live = sub.__aiter__()
            async with contextlib.aclosing(live):  # leaving the hub at once, not at garbage collection
                async for b in live:
                    r = b.data_parallel_rank
                    if b.sequence_number <= floor[r]:
                        continue
                    floor[r] = b.sequence_number
                    yield b
        finally:
            if live is None:  # never iterated, so its own cleanup will not run
                sub.close()

    async def _history(self, st: _Rank, start: int, ring: list[KvEventBatchData],
                       floor: dict[int, int]) -> AsyncIterator[KvEventBatchData]:
        """Batches ``start..floor[rank]``: the engine's replay for what precedes the ring, then the ring."""
        next_seq = start
        ring_first = ring[0].sequence_number if ring else floor[st.rank] + 1
        if ring_first > start:
            async with contextlib.aclosing(self._replay(st, start)) as replay:
                async for seq, payload in replay:
                    if seq >= ring_first or seq > next_seq:
                        break
                    if seq < next_seq:
                        continue
                    try:
                        batch = decode_batch(payload, seq, st.rank, DecodeStats())
                    except DecodeError:
                        break
                    yield batch
                    next_seq = seq + 1
        if next_seq < ring_first:
            # The history is gone: resynchronize this rank with a snapshot taken now.
            self.counters["history_unavailable"] += 1
            floor[st.rank] = st.last_seq
            for b in self.snapshot(st.rank):
                yield b
            return
        for b in ring:
            if b.sequence_number >= next_seq:
                yield b
