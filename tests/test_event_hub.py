"""SubscribeKvEvents and SubscribeRuntimeEvents: filtering, replay, terminal error then OK."""

from __future__ import annotations

import asyncio

import grpc
from helpers import collect, eventually, expect_status, gen_request, read_rest

from openengine_adapters.errors import EngineFailure
from openengine_adapters.event_hub import EventHub
from openengine_adapters.types import ErrorCode, RuntimeEventType
from openengine_adapters.v1 import kv_pb2
from openengine_adapters.v1 import observability_pb2 as obs
from openengine_adapters.v1.openengine_pb2_grpc import OpenEngineStub


async def next_event(call, timeout=5.0):
    return await asyncio.wait_for(call.read(), timeout)


async def wait_subscribers(hub: EventHub, n: int):
    await eventually(lambda: hub.subscriber_count >= n, timeout=5, message="subscriber did not attach")


async def test_runtime_events_filtered_by_type(oe):
    call = oe.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest(
        types=[obs.RUNTIME_EVENT_TYPE_FORWARD_PASS]))
    other = oe.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest(
        types=[obs.RUNTIME_EVENT_TYPE_QUEUE]))
    await wait_subscribers(oe.fake.runtime_hub, 2)
    await collect(oe.stub, gen_request("hi"))
    ev = await next_event(call)
    assert ev.runtime_event.type == obs.RUNTIME_EVENT_TYPE_FORWARD_PASS
    assert ev.runtime_event.event_id and ev.runtime_event.timestamp_unix_nanos > 0
    assert "batch_size" in ev.runtime_event.attributes
    oe.fake._publish_runtime(RuntimeEventType.QUEUE, {"queued": "1"})
    q = await next_event(other)
    assert q.runtime_event.type == obs.RUNTIME_EVENT_TYPE_QUEUE  # no FORWARD_PASS before it
    call.cancel()
    other.cancel()


async def test_runtime_events_reject_unspecified_type(oe):
    await expect_status(oe.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest(types=[0])),
                        grpc.StatusCode.INVALID_ARGUMENT, "types[0]")


async def test_slow_subscriber_is_cut_off_others_unaffected(serve):
    async with serve(None, event_queue=8) as h:
        # its own connection: an unread stream also stalls the connection's HTTP/2 window
        slow_channel = grpc.aio.insecure_channel(h.target)
        slow = OpenEngineStub(slow_channel).SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest())
        fast = h.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest())
        await wait_subscribers(h.fake.runtime_hub, 2)
        received = []

        async def read_fast():
            while len(received) < 80:
                received.append(await fast.read())

        reader = asyncio.ensure_future(read_fast())
        payload = "x" * 262144  # big events fill the unread stream's flow-control window
        for i in range(80):
            h.fake._publish_runtime(RuntimeEventType.BATCH, {"i": str(i), "pad": payload})
            await asyncio.sleep(0.002)
            # paced on the fast reader (its queue holds 8), so a loaded machine cannot make it "slow" too
            for _ in range(500):
                if len(received) >= i - 3:
                    break
                await asyncio.sleep(0.01)
        await asyncio.wait_for(reader, 10)
        assert [int(e.runtime_event.attributes["i"]) for e in received] == list(range(80))
        events = await asyncio.wait_for(read_rest(slow), 10)
        assert events[-1].WhichOneof("event") == "error"
        assert events[-1].error.code == ErrorCode.OVERLOADED and events[-1].error.retryable
        assert all(e.WhichOneof("event") == "runtime_event" for e in events[:-1])
        assert len(events) < 80
        assert await slow.code() == grpc.StatusCode.OK
        fast.cancel()
        await slow_channel.close()


async def test_kv_events_replay_and_snapshot(oe):
    await collect(oe.stub, gen_request("one"))
    await collect(oe.stub, gen_request("two"))
    call = oe.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True,
                                                                     start_sequence_number=1))
    first = await next_event(call)
    assert first.batch.events[0].WhichOneof("event") == "all_blocks_cleared"
    replay = [await next_event(call), await next_event(call)]
    assert [b.batch.sequence_number for b in replay] == [1, 2]
    stored = replay[0].batch.events[0].block_stored
    assert stored.block_hashes[0].encoding == "int64" and len(stored.block_hashes[0].value) == 8
    assert stored.medium == kv_pb2.STORAGE_MEDIUM_GPU and list(stored.extra_keys[0].values) == ["salt"]
    await wait_subscribers(oe.fake.kv_hub, 1)
    await collect(oe.stub, gen_request("three"))
    live = await next_event(call)
    assert live.batch.sequence_number == 3  # no gap, no duplicate
    call.cancel()


async def test_kv_stream_engine_failure_is_final_error_then_ok(oe):
    call = oe.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    await wait_subscribers(oe.fake.kv_hub, 1)
    oe.fake.kv_hub.close(EngineFailure(ErrorCode.INTERNAL, "publisher died"))
    events = await asyncio.wait_for(read_rest(call), 5)
    assert [e.WhichOneof("event") for e in events] == ["error"]
    assert events[0].error.message == "publisher died"
    assert await call.code() == grpc.StatusCode.OK


def test_event_hub_bounds_memory_per_subscriber():
    hub: EventHub[int] = EventHub(maxsize=3)
    a, b = hub.subscribe(), hub.subscribe(lambda x: x % 2 == 0)
    for i in range(10):
        hub.publish(i)
    assert len(a) == 0 and a._failure is not None  # cut off, queue freed
    assert len(b) == 0 and b._failure is not None
    c = hub.subscribe()
    hub.publish(1)
    assert len(c) == 1
