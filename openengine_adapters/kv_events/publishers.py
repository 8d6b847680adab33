"""An engine's ZMQ KV-event publishers (vLLM's and SGLang's), bridged into SubscribeKvEvents.

The engine publishes; the adapter subscribes to every publisher it was configured with (one per
data-parallel rank), bridges the events into the contract's stream, and, when the publishers are
advertised, names them in GetKvEventSources so routers may subscribe directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure
from openengine_adapters.kv_events.bridge import KvEventBridge
from openengine_adapters.kv_events.sources import source_info
from openengine_adapters.types import ErrorCode


class ZmqKvEvents:
    """The publishers and the bridge over them (started with the backend)."""

    def __init__(self, publishers: Sequence, advertise: bool = True) -> None:
        self.publishers = list(publishers)
        self.advertise = advertise  # False: a private publisher (a sidecar's default), bridged only
        self.bridge = None

    @property
    def streams(self) -> bool:
        """Whether SubscribeKvEvents is served."""
        return bool(self.publishers)

    @property
    def sources(self) -> bool:
        """Whether GetKvEventSources names the publishers."""
        return bool(self.publishers) and self.advertise

    async def start(self) -> None:
        if self.publishers:
            bridge = KvEventBridge(self.publishers)
            await bridge.start()
            self.bridge = bridge

    async def stop(self) -> None:
        if self.bridge is not None:
            await self.bridge.stop()
            self.bridge = None

    def source_info(self, host: str) -> list[be.KvEventSourceInfo]:
        """Every publisher, at ``host``: the service keeps the ranks asked for."""
        return [source_info(p, host) for p in self.publishers]

    def subscribe(self, ranks: Sequence[int], include_snapshot: bool, start_sequence_number: int):
        if self.bridge is None:
            raise EngineFailure(ErrorCode.INTERNAL, "the KV-event bridge is not running")
        return self.bridge.subscribe(ranks, include_snapshot, start_sequence_number)
