"""KV events on the REAL vLLM publisher: SubscribeKvEvents equals the raw ZMQ stream decoded here
independently; replay, snapshot and GetKvEventSources against a real engine with a small KV pool
(so evictions produce BlockRemoved) and ``reset_prefix_cache()`` (AllBlocksCleared)."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
import pytest_asyncio
from conftest import engine_args, serve_vllm
from helpers import collect, eventually, free_port
from kv_raw import KIND, RawCollector, pb_hash, raw_hash

from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, kv_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")

MEDIUM = {None: kv_pb2.STORAGE_MEDIUM_UNSPECIFIED, "GPU": kv_pb2.STORAGE_MEDIUM_GPU,
          "CPU": kv_pb2.STORAGE_MEDIUM_CPU_PINNED}


def assert_same(pb: kv_pb2.KvEventBatch, seq: int, payload: bytes) -> None:
    ts, events, rank = msgpack.unpackb(payload, raw=False)
    assert (pb.sequence_number, pb.data_parallel_rank) == (seq, rank)
    assert pb.timestamp_unix_nanos == round(ts * 1e9)
    assert [e.WhichOneof("event") for e in pb.events] == [KIND[ev["type"]] for ev in events]
    for e, ev in zip(pb.events, events, strict=True):
        if ev["type"] == "BlockStored":
            b = e.block_stored
            assert [pb_hash(h) for h in b.block_hashes] == [raw_hash(h) for h in ev["block_hashes"]]
            parent = ev.get("parent_block_hash")
            assert (pb_hash(b.parent_block_hash) if b.HasField("parent_block_hash") else None) == (
                raw_hash(parent) if parent is not None else None)
            assert list(b.token_ids) == ev["token_ids"] and b.block_size == ev["block_size"]
            assert b.lora_id == (ev.get("lora_id") or 0) and b.lora_name == (ev.get("lora_name") or "")
            assert b.medium == MEDIUM[ev.get("medium")]
            assert [list(k.values) for k in b.extra_keys] == [
                [str(v) for v in k] if k else [] for k in ev.get("extra_keys") or []]
            assert b.group_idx == (ev.get("group_idx") or 0)
            assert b.kv_cache_spec_kind == (ev.get("kv_cache_spec_kind") or "")
            assert b.kv_cache_spec_sliding_window == (ev.get("kv_cache_spec_sliding_window") or 0)
        elif ev["type"] == "BlockRemoved":
            b = e.block_removed
            assert [pb_hash(h) for h in b.block_hashes] == [raw_hash(h) for h in ev["block_hashes"]]
            assert b.medium == MEDIUM[ev.get("medium")] and b.group_idx == (ev.get("group_idx") or 0)


def raw_live_blocks(batches: list[tuple[int, bytes]]) -> set[tuple[bytes, str]]:
    live: set[tuple[bytes, str]] = set()
    for _seq, payload in batches:
        for ev in msgpack.unpackb(payload, raw=False)[1]:
            if ev["type"] == "AllBlocksCleared":
                live.clear()
            elif ev["type"] == "BlockStored":
                live.update(raw_hash(h) for h in ev["block_hashes"])
            elif ev["type"] == "BlockRemoved":
                live.difference_update(raw_hash(h) for h in ev["block_hashes"])
    return live


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def kv(model_dir):
    from vllm.config import KVEventsConfig

    pub_port, replay_port = free_port(), free_port()
    cfg = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{pub_port}",
                         replay_endpoint=f"tcp://*:{replay_port}", topic="kv")
    args = engine_args(model_dir, enable_prefix_caching=True, kv_events_config=cfg, block_size=32,
                       num_gpu_blocks_override=10, max_model_len=256)
    raw = RawCollector(f"tcp://127.0.0.1:{pub_port}", "kv")  # connected before the engine binds
    try:
        async with serve_vllm(args) as s:
            s.raw, s.pub_port, s.replay_port = raw, pub_port, replay_port
            yield s
    finally:
        raw.close()


async def generate(stub, n: int, offset: int, length: int = 70):
    for i in range(n):
        ids = [10 + (offset + i * 7 + j) % 240 for j in range(length)]
        await collect(stub, g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=ids),
                                              stopping=g.StoppingOptions(max_tokens=4, ignore_eos=True)),
                      timeout=60)


async def read_until(call, last_seq: int, timeout: float = 30.0) -> list[kv_pb2.KvEventBatch]:
    out = []
    deadline = time.monotonic() + timeout
    while not out or out[-1].sequence_number < last_seq:
        r = await asyncio.wait_for(call.read(), max(0.1, deadline - time.monotonic()))
        assert r.WhichOneof("event") == "batch", r
        out.append(r.batch)
    return out


async def raw_settled(kv, quiet_s: float = 0.5) -> list[tuple[int, bytes]]:
    """The raw batches once the publisher has been quiet for ``quiet_s``."""
    n = -1
    while n != len(kv.raw.batches):
        n = len(kv.raw.batches)
        await asyncio.sleep(quiet_s)
    return list(kv.raw.batches)


async def test_sources_are_routable(kv):
    resp = await kv.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
    (src,) = resp.sources
    assert src.transport == "zmq" and src.encoding == "msgpack" and src.topic == "kv"
    assert (src.endpoint_addr.host, src.endpoint_addr.port) == ("127.0.0.1", kv.pub_port)
    assert "*" not in src.replay_endpoint and src.replay_endpoint.endswith(f":{kv.replay_port}")
    assert src.data_parallel_rank == 0 and src.buffer_steps == 10_000 and src.hwm and src.max_queue_size


async def test_typed_stream_equals_raw_zmq(kv):
    call = kv.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    await eventually(lambda: kv.backend.kv_publishers.bridge.hub.subscriber_count, timeout=5)
    await generate(kv.stub, 8, 0)  # ~24 blocks through a 10-block pool: evictions
    assert await kv.engine.reset_prefix_cache()
    await generate(kv.stub, 2, 100)
    raw = await raw_settled(kv)
    assert [s for s, _ in raw] == list(range(len(raw)))  # the independent subscriber saw everything
    typed = await read_until(call, raw[-1][0])
    assert [b.sequence_number for b in typed] == [s for s, _ in raw]
    for pb, (seq, payload) in zip(typed, raw, strict=True):
        assert_same(pb, seq, payload)
    kinds = {e.WhichOneof("event") for b in typed for e in b.events}
    assert kinds == {"block_stored", "block_removed", "all_blocks_cleared"}
    call.cancel()


async def test_replay_from_sequence_number(kv):
    raw = await raw_settled(kv)
    assert len(raw) > 5
    call = kv.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(start_sequence_number=3))
    typed = await read_until(call, raw[-1][0])
    assert [b.sequence_number for b in typed] == [s for s, _ in raw[3:]]
    for pb, (seq, payload) in zip(typed, raw[3:], strict=True):
        assert_same(pb, seq, payload)
    await generate(kv.stub, 1, 200)  # then live, no gap, no duplicate
    raw = await raw_settled(kv)
    live = await read_until(call, raw[-1][0])
    assert [b.sequence_number for b in live] == list(range(typed[-1].sequence_number + 1, raw[-1][0] + 1))
    call.cancel()


async def test_snapshot_equals_live_blocks(kv):
    await generate(kv.stub, 2, 300)
    raw = await raw_settled(kv)
    call = kv.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True))
    first = await asyncio.wait_for(call.read(), 10)
    snap = first.batch
    assert snap.sequence_number == raw[-1][0]
    assert snap.events[0].WhichOneof("event") == "all_blocks_cleared"
    assert all(e.WhichOneof("event") == "block_stored" for e in snap.events[1:])
    blocks = {pb_hash(e.block_stored.block_hashes[0]) for e in snap.events[1:]}
    assert blocks == raw_live_blocks(raw) and 0 < len(blocks) <= 10
    assert all(e.block_stored.medium == kv_pb2.STORAGE_MEDIUM_GPU and len(e.block_stored.token_ids) == 32
               for e in snap.events[1:])
    call.cancel()


async def test_real_vllm_publisher_encoding_and_replay(tmp_path):
    """vLLM's own ZmqEventPublisher (no engine): msgspec's encoding and its replay ROUTER."""
    from vllm.distributed.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEventBatch,
        ZmqEventPublisher,
    )

    from openengine_adapters import backend as be
    from openengine_adapters.kv_events import KvEventBridge, PublisherConfig
    from openengine_adapters.types import StorageMedium

    ep, rep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    pub = ZmqEventPublisher(0, endpoint=ep, replay_endpoint=rep, topic="t", buffer_steps=50)
    batches = [
        [BlockStored(block_hashes=[b"\x01" * 32, 2**63 + 5], parent_block_hash=None, token_ids=[1, 2, 3, 4],
                     block_size=2, lora_id=None, medium="GPU", lora_name=None, extra_keys=[("salt",), None],
                     group_idx=1, kv_cache_spec_kind="full_attention")],
        [BlockRemoved(block_hashes=[2**63 + 5], medium="GPU", group_idx=1)],
        [AllBlocksCleared()],
        [BlockStored(block_hashes=[9], parent_block_hash=8, token_ids=[5, 6], block_size=2, lora_id=2,
                     medium="CPU", lora_name="ad")],
    ]
    try:
        for evs in batches[:2]:  # before the bridge: only the replay buffer has them
            pub.publish(KVEventBatch(ts=time.time(), events=evs))
        await asyncio.sleep(0.3)
        bridge = KvEventBridge([PublisherConfig(0, ep, rep, "t", 50)])
        await bridge.start()
        try:
            assert bridge.last_sequence_number(0) == 1
            it = bridge.subscribe([], False, 1)
            pending = asyncio.ensure_future(asyncio.wait_for(_take(it, 3), 10))
            await asyncio.sleep(0.3)
            for evs in batches[2:]:
                pub.publish(KVEventBatch(ts=time.time(), events=evs))
            got = await pending
            assert [b.sequence_number for b in got] == [1, 2, 3]
            assert got[0].events[0].event == be.BlockRemoved(
                (be.BlockHash((2**63 + 5).to_bytes(8, "big"), "int64"),), StorageMedium.GPU, 1)
            assert got[1].events[0].event == be.AllBlocksCleared()
            assert got[2].events[0].event == be.BlockStored(
                (be.BlockHash((9).to_bytes(8, "big"), "int64"),), be.BlockHash((8).to_bytes(8, "big"), "int64"),
                (5, 6), 2, lora_id=2, lora_name="ad", medium=StorageMedium.CPU_PINNED)
            (blk,) = bridge.live_blocks(0)
            assert blk.block_hashes[0].value == (9).to_bytes(8, "big")
            snap = bridge.snapshot(0)[0]
            assert [type(e.event) for e in snap.events] == [be.AllBlocksCleared, be.BlockStored]
            # the first batch (caught up from vLLM's replay ROUTER): a chained two-block store
            stored = bridge._ranks[0].ring[0].events[0].event
            assert stored.block_hashes == (be.BlockHash(b"\x01" * 32, "bytes"),
                                           be.BlockHash((2**63 + 5).to_bytes(8, "big"), "int64"))
            assert stored.extra_keys == (("salt",), ()) and stored.group_idx == 1
            assert stored.kv_cache_spec_kind == "full_attention" and stored.medium == StorageMedium.GPU
            await it.aclose()
        finally:
            await bridge.stop()
    finally:
        pub.shutdown()


async def _take(it, n):
    return [await it.__anext__() for _ in range(n)]
