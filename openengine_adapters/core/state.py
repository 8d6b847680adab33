"""What every RPC family of the core shares, and the checks every new piece of work passes.

``EngineService`` (``core.service``) is composed of one class per RPC family (``core.generation``,
``core.tasks``, ``core.control``, ``core.lora``, ``core.subscriptions``, ``core.discovery``), all on
this base: one request table, admission, drain state, watchdog and table of loaded LoRA adapters
for both surfaces. A family raises ``RequestRejected`` for a call it refuses; the wire turns that
into the status and the error trailer of the surface called (``wire.refusal``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from openengine_adapters.backend import EngineBackend, EngineIdentity, LoraAdapterInfo
from openengine_adapters.core.admission import Admission
from openengine_adapters.core.coalescing import GroupingPolicy
from openengine_adapters.core.drain import Lifecycle
from openengine_adapters.core.health import HealthReporter
from openengine_adapters.core.live_requests import LiveRequest, RequestRegistry
from openengine_adapters.core.watchdog import Watchdog
from openengine_adapters.errors import RequestRejected, rejected
from openengine_adapters.types import ErrorCode, Feature
from openengine_adapters.validation.catalog import ModelCatalog
from openengine_adapters.validation.generate import EngineContext
from openengine_adapters.validation.leniency import Leniency


@dataclass(frozen=True)
class ServiceOptions:
    instance_id: str = ""
    max_in_flight: int | None = None
    retry_after_ms: int = 100
    finished_id_memory: int = 65536
    advertise_host: str = "127.0.0.1"
    probe_timeout_s: float = 30.0
    coalesce_max_delay_ms: float = 0.0  # > 0 turns adaptive coalescing on (core.coalescing)
    coalesce_loop_cpu: float = 0.5  # share of a core the event loop uses before streams group their tokens
    lora_root: str | None = None  # LoadLora takes only directories under it (None: any, loopback callers only)
    max_subscriptions: int | None = 64  # open KV + runtime event subscriptions; None = unlimited
    stall_timeout_s: float = 30.0  # a stream whose client takes no message for this long is ended; 0 = off
    progress_timeout_s: float = 120.0  # work pending and no engine progress this long = hung; 0 = off
    ignored_options: str = "refuse"  # v0.1.0: options the engine would ignore are refused or dropped (leniency)


def unimplemented(what: str) -> RequestRejected:
    return RequestRejected(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not implemented by this engine "
                           "adapter", ErrorCode.UNSUPPORTED_FEATURE)


class CoreState:
    """The shared state (built by ``EngineService.__init__``) and the steps every family takes."""

    backend: EngineBackend
    options: ServiceOptions
    identity: EngineIdentity
    catalog: ModelCatalog
    instance_id: str
    registry: RequestRegistry
    admission: Admission
    lifecycle: Lifecycle
    health: HealthReporter
    coalescer: GroupingPolicy | None
    watchdog: Watchdog
    leniency: Leniency
    subscriptions: int  # open KV and runtime event streams (each costs every engine step)
    grpc_port: int | None  # the server's bound port, once it has one (native KV-event source)
    engine_died: asyncio.Event
    _loras: dict[str, LoraAdapterInfo]  # loaded adapters by name (core.lora keeps it)
    _lora_lock: asyncio.Lock
    _cleanups: set[asyncio.Task]
    _engine: EngineContext  # what request validation needs to know of the engine

    def _require(self, feature: Feature, what: str) -> None:
        if feature not in self.backend.features:
            raise unimplemented(what)

    def _check_accepting(self) -> None:
        """New work is refused while draining, and while the engine is dead or hung (retryable
        elsewhere): a hung engine takes work again once a probe inference proves it makes progress."""
        self.lifecycle.check_accepting()
        if self.watchdog.dead_reason:
            raise rejected(ErrorCode.INTERNAL, f"the engine died: {self.watchdog.dead_reason}", retry_after_ms=0)
        if self.watchdog.hung:
            raise rejected(ErrorCode.INTERNAL, "the engine is hung (no progress with work pending); it takes work "
                           "again once a probe inference finishes", retry_after_ms=0)

    def _background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    def _admit(self, request_id: str, kv_session_id: str | None = None) -> LiveRequest:
        entry = self.registry.register(request_id, kv_session_id)
        try:
            self.admission.acquire()
        except RequestRejected:
            self.registry.discard(entry)
            raise
        return entry

    def _unadmit(self, entry: LiveRequest) -> None:
        self.registry.discard(entry)
        self.admission.release()

