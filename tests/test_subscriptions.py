"""A limit on open event subscriptions (KV and runtime, both surfaces together), and none while draining."""

from __future__ import annotations

import grpc
from helpers import eventually, expect_status, rejection
from test_event_hub import wait_subscribers

from openengine_adapters.errors import RETRY_AFTER_TRAILER
from openengine_adapters.v1 import error_pb2, kv_pb2, lifecycle_pb2
from openengine_adapters.v1 import observability_pb2 as obs
from openengine_adapters.wire.v0_1.stub import V01Stub


async def wait_count(service, n: int) -> None:
    await eventually(lambda: service.subscriptions == n, timeout=5, message=f"expected {n} subscriptions open")


async def test_subscriptions_beyond_the_limit_are_resource_exhausted_with_a_retry_hint(serve):
    async with serve({"max_subscriptions": 2, "retry_after_ms": 250}) as h:
        runtime = h.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest())
        kv = V01Stub(h.channel).SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
        await wait_subscribers(h.fake.runtime_hub, 1)
        await wait_subscribers(h.fake.kv_hub, 1)
        v01 = V01Stub(h.channel)
        for call, revision1 in ((h.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(), timeout=5), True),
                                (v01.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(), timeout=5), False),
                                (h.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest(), timeout=5), True)):
            exc = await expect_status(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "limit of 2")
            err = rejection(exc)
            assert err.code == error_pb2.ERROR_CODE_OVERLOADED and err.retryable
            assert err.retry_after_ms == (250 if revision1 else 0)  # v0.1.0's EngineError has no such field
            assert dict(exc.trailing_metadata())[RETRY_AFTER_TRAILER] == "250"
        runtime.cancel()
        await wait_count(h.service, 1)  # a cancelled subscription frees its place
        again = h.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest())
        await wait_count(h.service, 2)
        again.cancel()
        kv.cancel()
        await wait_count(h.service, 0)


async def test_no_new_subscription_while_draining(oe):
    drain = oe.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True, deadline_ms=0))
    assert [r async for r in drain][-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE
    for call in (oe.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest(), timeout=5),
                 oe.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(), timeout=5),
                 V01Stub(oe.channel).SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(), timeout=5)):
        exc = await expect_status(call, grpc.StatusCode.UNAVAILABLE, "draining")
        assert rejection(exc).retryable  # go elsewhere, as drain-aborted streams are told
