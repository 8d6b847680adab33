"""The KV-event bridge: msgpack decoding (vLLM and SGLang layouts) and the ZMQ bridge on real sockets.

``VllmLikePublisher`` mimics vllm/distributed/kv_events.py ``ZmqEventPublisher`` exactly: a PUB
socket sending ``[topic, seq 8-byte BE, msgpack]``, a bounded replay buffer and a ROUTER that answers
``[id, b"", start_seq]`` with ``[id, b"", topic, seq, payload]`` per buffered batch ``>= start`` and
then ``[id, b"", b"", -1 (signed 8-byte), b""]``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
import threading
import time
from collections import deque

import grpc
import msgpack
import pytest
import zmq
from fake_backend import FakeBackend
from helpers import eventually, read_rest

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure, RequestRejected
from openengine_adapters.kv_events import DecodeError, DecodeStats, KvEventBridge, PublisherConfig, decode_batch
from openengine_adapters.kv_events.bridge import split_blocks
from openengine_adapters.kv_events.sources import local_address, offset_endpoint, publisher_binds, source_info
from openengine_adapters.server import OpenEngineServer
from openengine_adapters.server_config import ServerConfig
from openengine_adapters.types import ErrorCode, Feature, StorageMedium
from openengine_adapters.v1 import kv_pb2
from openengine_adapters.v1.openengine_pb2_grpc import OpenEngineStub

GPU, CPU, DISK, EXT, UNSPEC = (StorageMedium.GPU, StorageMedium.CPU_PINNED, StorageMedium.DISK,
                               StorageMedium.EXTERNAL, StorageMedium.UNSPECIFIED)


def h64(v: int) -> be.BlockHash:
    return be.BlockHash(v.to_bytes(8, "big"), "int64")


def pack(events, ts=1.5, rank=0):
    return msgpack.packb([ts, events, rank])


def stored(hashes, parent=None, tokens=None, block_size=2, **kw):
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens if tokens is not None else list(range(len(hashes) * block_size)),
          "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}
    ev.update(kw)
    return ev


def removed(hashes, medium="GPU"):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


CLEARED = {"type": "AllBlocksCleared"}


# --------------------------------------------------------------------------- decode


def test_decode_vllm_block_stored_all_keys():
    payload = pack([stored([b"\x01" * 32, 7], parent=-2, tokens=[1, 2, 3, 4], lora_id=3, lora_name="ad",
                           extra_keys=[["salt", ["mm", 0]], None], group_idx=1, kv_cache_spec_kind="full",
                           kv_cache_spec_sliding_window=64, locality="LOCAL", session_id="s")], ts=2.25, rank=3)
    b = decode_batch(payload, 11)
    assert (b.sequence_number, b.timestamp_unix_nanos, b.data_parallel_rank) == (11, 2_250_000_000, 3)
    (ev,) = [e.event for e in b.events]
    assert ev == be.BlockStored(
        block_hashes=(be.BlockHash(b"\x01" * 32, "bytes"), h64(7)),
        parent_block_hash=be.BlockHash((-2).to_bytes(8, "big", signed=True), "int64"),
        token_ids=(1, 2, 3, 4), block_size=2, lora_id=3, lora_name="ad", medium=GPU,
        extra_keys=(("salt", '["mm",0]'), ()), group_idx=1, kv_cache_spec_kind="full",
        kv_cache_spec_sliding_window=64)


@pytest.mark.parametrize("raw, expected", [
    # omitted default keys (msgspec omit_defaults) decode to the defaults
    ({"type": "BlockStored", "block_hashes": [5]}, be.BlockStored((h64(5),))),
    ({"type": "BlockRemoved", "block_hashes": [5]}, be.BlockRemoved((h64(5),))),
    ({"type": "BlockRemoved", "block_hashes": [b"ab"], "medium": "CPU", "group_idx": 2},
     be.BlockRemoved((be.BlockHash(b"ab", "bytes"),), CPU, 2)),
    ({"type": "BlockRemoved", "block_hashes": ["h1"], "medium": "DISK"},
     be.BlockRemoved((be.BlockHash(b"h1", "string"),), DISK)),
    ({"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": "STORAGE"},
     be.BlockRemoved((be.BlockHash(b"\xff" * 8, "int64"),), EXT)),
    ({"type": "BlockRemoved", "block_hashes": [1], "medium": "cpu_pinned"}, be.BlockRemoved((h64(1),), CPU)),
    ({"type": "AllBlocksCleared"}, be.AllBlocksCleared()),
    # SGLang: int64 hashes, optional medium / cache_salt / lora_name absent
    ({"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": 9, "token_ids": [4, 5],
      "block_size": 1, "lora_id": 0},
     be.BlockStored((h64(1), h64(2)), h64(9), (4, 5), 1)),
    # historical array_like tagged events: [tag, fields in declaration order...]
    (["BlockStored", [3], None, [1, 2], 2, None, "GPU"], be.BlockStored((h64(3),), None, (1, 2), 2, medium=GPU)),
    (["BlockRemoved", [3], "GPU"], be.BlockRemoved((h64(3),), GPU)),
    (["AllBlocksCleared"], be.AllBlocksCleared()),
])
def test_decode_event_table(raw, expected):
    b = decode_batch(pack([raw]), 0)
    assert [e.event for e in b.events] == [expected]


def test_unknown_and_malformed_events_are_skipped_and_counted():
    stats = DecodeStats()
    payload = pack([{"type": "BlockPinned", "block_hashes": [1]}, CLEARED, ["Mystery", 1],
                    {"type": "BlockStored", "block_hashes": "notalist"},
                    {"type": "BlockStored", "block_hashes": [1], "token_ids": ["x"]}, 17, removed([4])])
    b = decode_batch(payload, 4, stats=stats)
    assert [type(e.event) for e in b.events] == [be.AllBlocksCleared, be.BlockRemoved]
    assert stats.unknown_events == {"BlockPinned": 1, "Mystery": 1}
    assert stats.malformed_events == 3 and stats.skipped == 5 and stats.events == 2


def test_decode_batch_layouts():
    # SGLang / map batches, missing dp rank, rank of the source winning over the payload's
    m = msgpack.packb({"ts": 3.0, "events": [CLEARED], "attn_dp_rank": 2})
    assert decode_batch(m, 1).data_parallel_rank == 2
    assert decode_batch(m, 1, data_parallel_rank=5).data_parallel_rank == 5
    assert decode_batch(msgpack.packb([1.0, []]), 0).data_parallel_rank == 0  # omitted trailing rank
    assert decode_batch(msgpack.packb([1.0, [], None]), 0).events == ()
    for bad in (b"\xc1", msgpack.packb(5), msgpack.packb([1.0, "x"]), msgpack.packb([-1.0, []])):
        with pytest.raises(DecodeError):
            decode_batch(bad, 0)


def test_split_blocks_chains_parents_and_slices():
    ev = be.BlockStored((h64(1), h64(2)), h64(0), (1, 2, 3, 4), 2, extra_keys=(("a",), ()), medium=GPU)
    a, b = split_blocks(ev)
    assert (a.block_hashes, a.parent_block_hash, a.token_ids, a.extra_keys) == ((h64(1),), h64(0), (1, 2), (("a",),))
    assert (b.block_hashes, b.parent_block_hash, b.token_ids, b.extra_keys) == ((h64(2),), h64(1), (3, 4), ((),))


def test_sources():
    assert publisher_binds("tcp://*:5557") and publisher_binds("tcp://[::]:1") and publisher_binds("ipc:///x")
    assert not publisher_binds("tcp://10.0.0.2:5557")
    assert local_address("tcp://*:5557") == "tcp://127.0.0.1:5557"
    assert local_address("tcp://10.0.0.2:5557") == "tcp://10.0.0.2:5557"
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559" and offset_endpoint("tcp://*:0", 2) == "tcp://*:0"
    info = source_info(PublisherConfig(1, "tcp://*:5558", "tcp://*:5560", "kv", 10, 20, 30), "10.1.2.3")
    assert info == be.KvEventSourceInfo("zmq", be.KvEndpoint("*", 5558, "tcp"), "kv", "tcp://10.1.2.3:5560", 1,
                                        "msgpack", None, 10, 20, 30)
    assert source_info(PublisherConfig(0, "tcp://[::]:7"), "h").endpoint_addr == be.KvEndpoint("::", 7, "tcp")


# --------------------------------------------------------------------------- a vLLM-like publisher


class VllmLikePublisher:
    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: str = "kv", buffer_steps: int = 100):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.topic = topic.encode()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.lock = threading.Lock()
        self.seq = itertools.count()
        self.running = True
        self.replay = None
        if replay_endpoint:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.bind(replay_endpoint)
            self.thread = threading.Thread(target=self._serve_replay, daemon=True)
            self.thread.start()

    def publish(self, events, *, send=True, buffer=True) -> int:
        """send=False: lost on the wire but replayable; buffer=False too: lost for good."""
        seq = next(self.seq)
        payload = pack(events, ts=time.time())
        if send:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        if buffer:
            with self.lock:
                self.buffer.append((seq, payload))
        return seq

    def _serve_replay(self):
        while self.running:
            if not self.replay.poll(20):
                continue
            frame = self.replay.recv_multipart()
            if len(frame) != 3:
                continue
            client_id, _, start_bytes = frame
            start = int.from_bytes(start_bytes, "big")
            with self.lock:
                items = list(self.buffer)
            for seq, buf in items:
                if seq >= start:
                    self.replay.send_multipart((client_id, b"", self.topic, seq.to_bytes(8, "big"), buf))
            self.replay.send_multipart((client_id, b"", b"", self.END_SEQ, b""))

    def close(self):
        self.running = False
        if self.replay is not None:
            self.thread.join(2)
        self.ctx.destroy(linger=0)


@pytest.fixture
def ipc_dir():
    with tempfile.TemporaryDirectory(prefix="oe-kv-") as d:
        yield d


class Rig:
    def __init__(self, pub: VllmLikePublisher, bridge: KvEventBridge):
        self.pub, self.bridge = pub, bridge

    async def publish(self, events, **kw) -> int:
        seq = self.pub.publish(events, **kw)
        return seq

    async def settle(self, seq: int, rank: int = 0, timeout: float = 5.0):
        await eventually(lambda: self.bridge.last_sequence_number(rank) >= seq, timeout=timeout, interval=0.005,
                         message=f"bridge stuck before sequence {seq} on rank {rank}")


async def make_rig(ipc_dir, *, replay=True, buffer_steps=100, **bridge_kw) -> Rig:
    ep = f"ipc://{os.path.join(ipc_dir, 'pub')}"
    rep = f"ipc://{os.path.join(ipc_dir, 'replay')}" if replay else None
    pub = VllmLikePublisher(ep, rep, buffer_steps=buffer_steps)
    bridge_kw.setdefault("replay_timeout_s", 1.0)
    bridge = KvEventBridge([PublisherConfig(0, ep, rep, "kv", buffer_steps)], **bridge_kw)
    await bridge.start()
    await asyncio.sleep(0.2)  # let the SUB subscription reach the publisher
    return Rig(pub, bridge)


@pytest.fixture
async def rig_factory(ipc_dir):
    rigs = []

    async def make(**kw):
        rig = await make_rig(ipc_dir, **kw)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        await rig.bridge.stop()
        rig.pub.close()


async def take(it, n: int, timeout: float = 5.0) -> list[be.KvEventBatchData]:
    out = []
    for _ in range(n):
        out.append(await asyncio.wait_for(it.__anext__(), timeout))
    return out


def workload(i: int) -> list:
    """Batch i: stores block i (chained to i-1), removes block i-3 every third batch, one clear."""
    if i == 7:
        return [CLEARED]
    evs = [stored([100 + i], parent=100 + i - 1 if i else None, extra_keys=[["salt"]])]
    if i % 3 == 2:
        evs.append(removed([100 + i - 3]))
    return evs


def model_blocks(batches: list[list]) -> set[bytes]:
    live: set[bytes] = set()
    for evs in batches:
        for ev in evs:
            if ev["type"] == "AllBlocksCleared":
                live.clear()
            elif ev["type"] == "BlockStored":
                live.update(h64(h).value for h in ev["block_hashes"])
            else:
                live.difference_update(h64(h).value for h in ev["block_hashes"])
    return live


def stored_hashes(batches) -> set[bytes]:
    return {e.event.block_hashes[0].value for b in batches for e in b.events if isinstance(e.event, be.BlockStored)}


async def test_bridge_stream_equals_published(rig_factory):
    rig = await rig_factory()
    it = rig.bridge.subscribe([], False, 0)
    first = asyncio.ensure_future(take(it, 12))
    await asyncio.sleep(0.05)
    payloads = []
    for i in range(12):
        payloads.append(workload(i))
        await rig.publish(payloads[-1])
    got = await first
    assert [b.sequence_number for b in got] == list(range(12))
    for b, evs in zip(got, payloads, strict=True):
        expected = decode_batch(pack(evs), b.sequence_number, 0)
        assert b.events == expected.events and b.data_parallel_rank == 0 and b.timestamp_unix_nanos > 0
    assert {b.block_hashes[0].value for b in rig.bridge.live_blocks(0)} == model_blocks(payloads)
    assert rig.bridge.counters["gaps"] == 0
    await it.aclose()


async def test_replay_from_sequence_ring_and_engine_then_live(rig_factory):
    rig = await rig_factory(ring_size=4)  # the ring holds 4 batches: older history comes from the engine
    payloads = [workload(i) for i in range(10)]
    for evs in payloads:
        await rig.publish(evs)
    await rig.settle(9)
    it = rig.bridge.subscribe([0], False, 2)
    history = await take(it, 8)
    assert [b.sequence_number for b in history] == list(range(2, 10))
    assert all(b.events == decode_batch(pack(p), 0).events for b, p in zip(history, payloads[2:], strict=True))
    pending = asyncio.ensure_future(take(it, 2))
    await asyncio.sleep(0.05)
    await rig.publish(workload(10))
    await rig.publish(workload(11))
    assert [b.sequence_number for b in await pending] == [10, 11]  # no gap, no duplicate
    await it.aclose()


async def test_replay_races_live_batches_without_gap_or_duplicate(rig_factory):
    rig = await rig_factory(ring_size=2)
    for i in range(6):
        await rig.publish(workload(i))
    await rig.settle(5)
    it = rig.bridge.subscribe([0], False, 1)
    pending = asyncio.ensure_future(take(it, 14))
    for i in range(6, 15):  # published while the subscriber is replaying from the engine
        await rig.publish(workload(i))
    assert [b.sequence_number for b in await pending] == list(range(1, 15))
    await it.aclose()


async def test_snapshot_equals_live_block_set_then_live(rig_factory):
    rig = await rig_factory(snapshot_chunk=3)
    payloads = [workload(i) for i in range(14)]
    for evs in payloads:
        await rig.publish(evs)
    await rig.settle(13)
    it = rig.bridge.subscribe([], True, 5)  # start_sequence_number is superseded by the snapshot
    live = model_blocks(payloads)
    n_chunks = -(-(len(live) + 1) // 3)
    snap = await take(it, n_chunks)
    assert {b.sequence_number for b in snap} == {13}
    assert isinstance(snap[0].events[0].event, be.AllBlocksCleared)
    assert stored_hashes(snap) == live and sum(len(b.events) for b in snap) == len(live) + 1
    blk = next(e.event for b in snap for e in b.events if isinstance(e.event, be.BlockStored))
    assert blk.medium == GPU and blk.extra_keys == (("salt",),) and blk.block_size == 2
    pending = asyncio.ensure_future(take(it, 1))
    await asyncio.sleep(0.05)
    await rig.publish(workload(14))
    assert [b.sequence_number for b in await pending] == [14]
    await it.aclose()


async def test_snapshot_before_any_batch(rig_factory):
    rig = await rig_factory()
    it = rig.bridge.subscribe([], True, 0)
    (snap,) = await take(it, 1)
    assert snap.sequence_number == 0 and [type(e.event) for e in snap.events] == [be.AllBlocksCleared]
    pending = asyncio.ensure_future(take(it, 1))
    await asyncio.sleep(0.05)
    await rig.publish(workload(0))
    assert (await pending)[0].sequence_number == 0
    await it.aclose()


async def test_wire_gap_is_healed_by_replay(rig_factory):
    rig = await rig_factory()
    it = rig.bridge.subscribe([], False, 0)
    pending = asyncio.ensure_future(take(it, 8))
    await asyncio.sleep(0.05)
    payloads = [workload(i) for i in range(8)]
    for i, evs in enumerate(payloads):
        await rig.publish(evs, send=i not in (3, 4))  # lost on the wire, still in the replay buffer
    got = await pending
    assert [b.sequence_number for b in got] == list(range(8))
    assert [b.events for b in got] == [decode_batch(pack(p), 0).events for p in payloads]
    assert rig.bridge.counters["gaps"] == 1 and rig.bridge.counters["healed_by_clear"] == 0
    await it.aclose()


async def test_unreplayable_gap_is_healed_with_all_blocks_cleared(rig_factory):
    rig = await rig_factory()
    it = rig.bridge.subscribe([], False, 0)
    pending = asyncio.ensure_future(take(it, 6))
    await asyncio.sleep(0.05)
    for i in range(6):
        await rig.publish(workload(i), send=i != 3, buffer=i != 3)  # batch 3 is lost for good
    await rig.publish(workload(6), send=True)
    got = await pending
    assert [b.sequence_number for b in got] == [0, 1, 2, 3, 4, 5]
    assert [type(e.event) for e in got[3].events] == [be.AllBlocksCleared]  # synthesized under the lost number
    assert rig.bridge.counters["healed_by_clear"] == 1
    await rig.settle(6)
    # after the heal only what was stored since is known: nothing stale survives
    assert {b.block_hashes[0].value for b in rig.bridge.live_blocks(0)} == model_blocks([workload(4), workload(5),
                                                                                          workload(6)])
    await it.aclose()


async def test_undecodable_batch_is_healed_not_skipped(rig_factory):
    rig = await rig_factory()
    it = rig.bridge.subscribe([], False, 0)
    pending = asyncio.ensure_future(take(it, 3))
    await asyncio.sleep(0.05)
    await rig.publish(workload(0))
    rig.pub.pub.send_multipart((b"kv", next(rig.pub.seq).to_bytes(8, "big"), b"\xc1garbage"))
    await rig.publish(workload(2))
    got = await pending
    assert [b.sequence_number for b in got] == [0, 1, 2]
    assert [type(e.event) for e in got[1].events] == [be.AllBlocksCleared]
    await it.aclose()


async def test_history_no_longer_available_falls_back_to_snapshot(rig_factory):
    rig = await rig_factory(ring_size=2, buffer_steps=3)
    payloads = [workload(i) for i in range(10)]
    for evs in payloads:
        await rig.publish(evs)
    await rig.settle(9)
    it = rig.bridge.subscribe([], False, 1)
    first = await take(it, 1)
    assert first[0].sequence_number == 9 and isinstance(first[0].events[0].event, be.AllBlocksCleared)
    assert stored_hashes(first) == model_blocks(payloads)
    assert rig.bridge.counters["history_unavailable"] == 1
    await it.aclose()


async def test_late_bridge_catches_up_from_engine_replay(ipc_dir):
    ep, rep = f"ipc://{ipc_dir}/p", f"ipc://{ipc_dir}/r"
    pub = VllmLikePublisher(ep, rep)
    payloads = [workload(i) for i in range(5)]
    for evs in payloads:
        pub.publish(evs)  # before any subscriber: only the replay buffer has them
    bridge = KvEventBridge([PublisherConfig(0, ep, rep, "kv")], replay_timeout_s=1.0)
    try:
        await bridge.start()
        assert bridge.last_sequence_number(0) == 4
        assert {b.block_hashes[0].value for b in bridge.live_blocks(0)} == model_blocks(payloads)
    finally:
        await bridge.stop()
        pub.close()


async def test_subscriber_validation_and_stop(rig_factory):
    rig = await rig_factory()
    with pytest.raises(RequestRejected, match="rank"):
        rig.bridge.subscribe([1], False, 0)
    it = rig.bridge.subscribe([0], False, 0)
    pending = asyncio.ensure_future(take(it, 1))
    await asyncio.sleep(0.05)
    await rig.bridge.stop()
    with pytest.raises(EngineFailure) as err:
        await pending
    assert err.value.code == ErrorCode.DRAINING and err.value.retryable
    with pytest.raises(EngineFailure):
        rig.bridge.subscribe([0], False, 0)


async def test_unstarted_subscription_does_not_leak(rig_factory):
    rig = await rig_factory()
    for _ in range(3):
        it = rig.bridge.subscribe([], True, 0)
        await take(it, 1)  # snapshot only, closed before going live
        await it.aclose()
    assert rig.bridge.hub.subscriber_count == 0


# --------------------------------------------------------------------------- through the gRPC service


class BridgedBackend(FakeBackend):
    def __init__(self, bridge: KvEventBridge, **kw):
        super().__init__(**kw)
        self.bridge = bridge
        self.features = self.features | {Feature.KV_EVENTS, Feature.KV_EVENT_SOURCES}

    def kv_events(self, ranks, include_snapshot, start_sequence_number):
        return self.bridge.subscribe(ranks, include_snapshot, start_sequence_number)


async def test_grpc_two_subscribers_one_stalled(rig_factory):
    rig = await rig_factory(subscriber_queue=8, ring_size=4, max_live_blocks=4)
    backend = BridgedBackend(rig.bridge)
    server = await OpenEngineServer(backend, ServerConfig(host="127.0.0.1", port=0, advertise_host="127.0.0.1",
                                                          drain_grace_s=0.5)).start()
    fast_channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    slow_channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")  # its own HTTP/2 window
    try:
        fast = OpenEngineStub(fast_channel).SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
        slow = OpenEngineStub(slow_channel).SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
        await eventually(lambda: rig.bridge.hub.subscriber_count == 2, timeout=5)
        n, received = 60, []

        async def read_fast():
            while len(received) < n:
                received.append(await fast.read())

        reader = asyncio.ensure_future(read_fast())
        big = [7] * 150_000  # big batches fill the unread stream's flow-control window
        for i in range(n):
            await rig.publish([stored([1000 + i], tokens=big, block_size=len(big))])
            await asyncio.sleep(0.003)
            # paced on the fast reader (its queue holds 8), so a loaded machine cannot make it "slow" too
            for _ in range(500):
                if len(received) >= i - 3:
                    break
                await asyncio.sleep(0.01)
        await asyncio.wait_for(reader, 15)
        assert [r.batch.sequence_number for r in received] == list(range(n))
        assert received[5].batch.events[0].block_stored.block_hashes[0].value == (1005).to_bytes(8, "big")
        events = await asyncio.wait_for(read_rest(slow), 15)
        assert events[-1].WhichOneof("event") == "error"
        assert events[-1].error.code == ErrorCode.OVERLOADED and events[-1].error.retryable
        assert all(e.WhichOneof("event") == "batch" for e in events[:-1]) and len(events) < n
        assert await slow.code() == grpc.StatusCode.OK
        assert rig.bridge.hub.subscriber_count == 1  # the stalled one is gone, its queue freed
        fast.cancel()
    finally:
        await fast_channel.close()
        await slow_channel.close()
        await server.stop(0.5)


async def test_two_ranks_filtered_and_replayed_per_rank(ipc_dir):
    pubs = [VllmLikePublisher(f"ipc://{ipc_dir}/p{r}", f"ipc://{ipc_dir}/r{r}") for r in (0, 1)]
    bridge = KvEventBridge([PublisherConfig(r, f"ipc://{ipc_dir}/p{r}", f"ipc://{ipc_dir}/r{r}", "kv")
                            for r in (0, 1)], replay_timeout_s=1.0)
    try:
        await bridge.start()
        await asyncio.sleep(0.2)
        only1 = bridge.subscribe([1], False, 0)
        pending = asyncio.ensure_future(take(only1, 3))
        await asyncio.sleep(0.05)
        for i in range(3):
            pubs[0].publish(workload(i))
            pubs[1].publish(workload(i))
        got = await pending
        assert [(b.data_parallel_rank, b.sequence_number) for b in got] == [(1, 0), (1, 1), (1, 2)]
        await eventually(lambda: all(bridge.last_sequence_number(r) >= 2 for r in (0, 1)), interval=0.005)
        both = bridge.subscribe([], False, 1)
        got = await take(both, 4)
        assert [(b.data_parallel_rank, b.sequence_number) for b in got] == [(0, 1), (0, 2), (1, 1), (1, 2)]
        await only1.aclose()
        await both.aclose()
        assert bridge.hub.subscriber_count == 0
    finally:
        await bridge.stop()
        for p in pubs:
            p.close()
