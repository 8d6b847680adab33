"""SubscribeKvEvents and SubscribeRuntimeEvents: long-lived event streams, limited in number and
ended by the stall watchdog when their client stops reading."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from openengine_adapters.core.state import CoreState
from openengine_adapters.core.stream import engine_error
from openengine_adapters.errors import EngineFailure, RequestRejected, invalid, refusal, rejected
from openengine_adapters.messages import kv as kv_messages
from openengine_adapters.messages import observability as observability_messages
from openengine_adapters.types import ErrorCode, Feature, RuntimeEventType
from openengine_adapters.v1 import kv_pb2, observability_pb2

log = logging.getLogger(__name__)


class SubscriptionRpcs(CoreState):
    async def _event_stream(self, feature: Feature, what: str,
                            open_stream: Callable[[], AsyncIterator], wrap: Callable,
                            response_type) -> AsyncIterator:
        """One subscription: refused (raised) if it cannot start; once started, every item wrapped as a
        response, and a failure of the engine's stream as one terminal error response."""
        try:
            self._require(feature, what)
            self._check_accepting()
            limit = self.options.max_subscriptions
            if limit is not None and self.subscriptions >= limit:
                raise rejected(
                    ErrorCode.OVERLOADED,
                    f"subscriptions: {self.subscriptions} open event subscriptions reach the limit of {limit}; "
                    "retry later", retry_after_ms=self.options.retry_after_ms)
            events = open_stream()
        except Exception as exc:
            if not isinstance(exc, RequestRejected | EngineFailure):
                log.exception("%s could not start", what)
            raise refusal(exc, f"{what} could not start") from exc
        self.subscriptions += 1
        held = [True]  # the subscription slot, given back once (here or by the stall watchdog)

        def release() -> None:
            if held[0]:
                held[0] = False
                self.subscriptions -= 1

        def on_stall() -> None:  # the client stopped reading: free the slot, end the RPC
            release()
            if watch.task is not None:
                watch.task.cancel()

        watch = self.watchdog.watch(on_stall)
        now = time.monotonic
        try:
            async for item in events:
                watch.pending_since = now()
                yield wrap(item)
                watch.pending_since = None
        except EngineFailure as failure:
            watch.pending_since = now()
            yield response_type(error=engine_error(failure))
        except asyncio.CancelledError:
            if not watch.claims(asyncio.current_task()):
                raise
            watch.pending_since = now()  # a hung or dead engine: one terminal retryable error
            yield response_type(error=engine_error(watch.failure))
        except Exception as exc:
            log.exception("%s stream failed", what)
            yield response_type(error=engine_error(
                EngineFailure(ErrorCode.INTERNAL, f"{what} stream failed: {exc}")))
        finally:
            self.watchdog.streams.discard(watch)
            release()
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    async def SubscribeKvEvents(self, request: kv_pb2.SubscribeKvEventsRequest, context):
        stream = self._event_stream(
            Feature.KV_EVENTS, "SubscribeKvEvents",
            lambda: self.backend.kv_events(list(request.data_parallel_ranks),
                                           request.include_snapshot, request.start_sequence_number),
            lambda batch: kv_pb2.SubscribeKvEventsResponse(batch=kv_messages.kv_event_batch(batch)),
            kv_pb2.SubscribeKvEventsResponse)
        async for response in stream:
            yield response

    async def SubscribeRuntimeEvents(self, request: observability_pb2.SubscribeRuntimeEventsRequest,
                                     context):
        def open_stream():
            types = []
            for i, t in enumerate(request.types):
                if t == 0 or t not in RuntimeEventType._value2member_map_:
                    raise invalid(f"types[{i}]: {t} is not a runtime event type")
                types.append(RuntimeEventType(t))
            return self.backend.runtime_events(types)

        stream = self._event_stream(
            Feature.RUNTIME_EVENTS, "SubscribeRuntimeEvents", open_stream,
            lambda ev: observability_pb2.SubscribeRuntimeEventsResponse(
                runtime_event=observability_messages.runtime_event(ev)),
            observability_pb2.SubscribeRuntimeEventsResponse)
        async for response in stream:
            yield response

