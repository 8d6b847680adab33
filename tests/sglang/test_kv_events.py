"""KV events from SGLang's REAL ZMQ publisher through the shared bridge: SubscribeKvEvents equals
the raw stream decoded here independently; replay, snapshot and GetKvEventSources."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
from conftest import PAGE_SIZE
from helpers import collect, eventually
from kv_raw import KIND, RawCollector, pb_hash, raw_hash

from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, kv_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")

MEDIUM = {None: kv_pb2.STORAGE_MEDIUM_UNSPECIFIED, "GPU": kv_pb2.STORAGE_MEDIUM_GPU,
          "CPU_PINNED": kv_pb2.STORAGE_MEDIUM_CPU_PINNED, "DISK": kv_pb2.STORAGE_MEDIUM_DISK,
          "EXTERNAL": kv_pb2.STORAGE_MEDIUM_EXTERNAL}


def assert_same(pb, seq, payload):
    """SGLang's payload ``[ts, events, dp_rank]`` (maps tagged "type") decoded by key name."""
    ts, events, rank = msgpack.unpackb(payload, raw=False)
    assert (pb.sequence_number, pb.data_parallel_rank) == (seq, rank or 0)
    assert abs(pb.timestamp_unix_nanos - ts * 1e9) < 1e3
    assert [e.WhichOneof("event") for e in pb.events] == [KIND[ev["type"]] for ev in events]
    for e, ev in zip(pb.events, events, strict=True):
        if ev["type"] == "BlockStored":
            b = e.block_stored
            assert [pb_hash(h) for h in b.block_hashes] == [raw_hash(h) for h in ev["block_hashes"]]
            parent = ev.get("parent_block_hash")
            assert (pb_hash(b.parent_block_hash) if b.HasField("parent_block_hash") else None) == (
                raw_hash(parent) if parent is not None else None)
            assert list(b.token_ids) == ev["token_ids"] and b.block_size == ev["block_size"] == PAGE_SIZE
            assert b.medium == MEDIUM[ev.get("medium")]
        elif ev["type"] == "BlockRemoved":
            assert [pb_hash(h) for h in e.block_removed.block_hashes] == [raw_hash(h) for h in ev["block_hashes"]]


async def generate(stub, n, offset, length=40):
    for i in range(n):
        ids = [10 + (offset + i * 7 + j) % 240 for j in range(length)]
        r = g.GenerateRequest(request_id=f"kv-{offset}-{i}", model="tiny", token_ids=input_pb2.TokenIds(ids=ids))
        r.stopping.max_tokens = 4
        r.stopping.ignore_eos = True
        await collect(stub, r, timeout=60)


async def settled(raw, quiet_s=0.6):
    n = -1
    while n != len(raw.batches):
        n = len(raw.batches)
        await asyncio.sleep(quiet_s)
    return list(raw.batches)


async def read_until(call, last_seq, timeout=30.0):
    out = []
    deadline = time.monotonic() + timeout
    while not out or out[-1].sequence_number < last_seq:
        r = await asyncio.wait_for(call.read(), max(0.1, deadline - time.monotonic()))
        assert r.WhichOneof("event") == "batch", r
        out.append(r.batch)
    return out


async def flush_when_idle(tm, timeout_s: float = 20.0):
    """SGLang refuses to flush while its scheduler still holds a request (a finished stream's
    request may be released a step later), so retry until it is idle."""
    async def flushed() -> bool:
        return (await tm.flush_cache()).success

    await eventually(flushed, timeout_s, 0.2, "SGLang never became idle enough to flush")


@pytest.fixture(scope="module")
def raw(kv_ports):
    collector = RawCollector(f"tcp://127.0.0.1:{kv_ports[0]}", "kv")
    time.sleep(0.5)  # ZMQ slow joiner
    yield collector
    collector.close()


async def test_sources_advertise_routable_publisher(served, kv_ports):
    resp = await served.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
    (src,) = resp.sources
    assert src.transport == "zmq" and src.encoding == "msgpack" and src.topic == "kv"
    assert (src.endpoint_addr.host, src.endpoint_addr.port) == ("127.0.0.1", kv_ports[0])
    assert src.replay_endpoint == f"tcp://127.0.0.1:{kv_ports[1]}"
    assert src.data_parallel_rank == 0 and src.buffer_steps == 10000


async def test_typed_stream_equals_sglang_zmq(served, raw):
    call = served.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    await eventually(lambda: served.backend.kv_publishers.bridge.hub.subscriber_count, timeout=5)
    start = len(raw.batches)
    await generate(served.stub, 4, 0)
    await flush_when_idle(served.tm)  # SGLang's radix-cache reset: AllBlocksCleared
    await generate(served.stub, 1, 50)
    batches = (await settled(raw))[start:]
    assert batches, "SGLang published no KV event"
    typed = await read_until(call, batches[-1][0])
    by_seq = {b.sequence_number: b for b in typed}
    for seq, payload in batches:
        assert_same(by_seq[seq], seq, payload)
    kinds = {e.WhichOneof("event") for b in typed for e in b.events}
    assert {"block_stored", "all_blocks_cleared"} <= kinds
    call.cancel()


async def test_replay_from_sequence_number(served, raw):
    await generate(served.stub, 2, 100)
    batches = await settled(raw)
    first = batches[len(batches) // 2][0]
    call = served.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(start_sequence_number=first))
    typed = await read_until(call, batches[-1][0])
    assert [b.sequence_number for b in typed] == list(range(first, batches[-1][0] + 1))
    known = dict(batches)
    for pb in typed:
        if pb.sequence_number in known:
            assert_same(pb, pb.sequence_number, known[pb.sequence_number])
    call.cancel()


async def test_snapshot_lists_live_pages(served, raw):
    await generate(served.stub, 1, 200)
    batches = await settled(raw)
    call = served.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True))
    snap = (await asyncio.wait_for(call.read(), 10)).batch
    assert snap.sequence_number == batches[-1][0]
    assert snap.events[0].WhichOneof("event") == "all_blocks_cleared"
    stored = [e.block_stored for e in snap.events[1:]]
    assert stored and all(len(b.token_ids) == PAGE_SIZE for b in stored)
    call.cancel()
