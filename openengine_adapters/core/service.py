"""The engine-agnostic core: every RPC of both wire surfaces runs here, on one EngineBackend.

Its methods take and return revision-1 messages, the superset of the two contracts: the
revision-1 surface registers it as is (``wire.revision1``), the v0.1.0 surface translates at its
boundary (``wire.v0_1``). So both surfaces share one request table, admission, drain state and
KV-session table, and every validation rule is written once.

``EngineService`` is one class per RPC family over the state they share (``core.state``):
generation, tasks, control (Health, Abort, Drain), LoRA, event subscriptions, discovery. A call
refused before acceptance raises ``RequestRejected``; the wire answers it with the status and the
``openengine-error-bin`` trailer of the surface called (``wire.refusal``).
"""

from __future__ import annotations

import asyncio
import uuid

from openengine_adapters.backend import EngineBackend
from openengine_adapters.core.admission import Admission
from openengine_adapters.core.coalescing import GroupingPolicy
from openengine_adapters.core.control import ControlRpcs
from openengine_adapters.core.discovery import DiscoveryRpcs
from openengine_adapters.core.drain import Lifecycle
from openengine_adapters.core.generation import GenerationRpcs
from openengine_adapters.core.health import HealthReporter
from openengine_adapters.core.live_requests import RequestRegistry
from openengine_adapters.core.lora import LoraRpcs
from openengine_adapters.core.state import ServiceOptions
from openengine_adapters.core.subscriptions import SubscriptionRpcs
from openengine_adapters.core.tasks import TaskRpcs
from openengine_adapters.core.watchdog import Watchdog
from openengine_adapters.errors import EngineFailure
from openengine_adapters.messages import model as model_messages
from openengine_adapters.types import Feature
from openengine_adapters.validation.catalog import ModelCatalog
from openengine_adapters.validation.generate import EngineContext
from openengine_adapters.validation.leniency import Leniency

__all__ = ["EngineService", "ServiceOptions"]


class EngineService(GenerationRpcs, TaskRpcs, ControlRpcs, LoraRpcs, SubscriptionRpcs, DiscoveryRpcs):
    def __init__(self, backend: EngineBackend, options: ServiceOptions = ServiceOptions(),
                 admission: Admission | None = None) -> None:
        self.backend = backend
        self.options = options
        self.identity = backend.identity()
        self.catalog = ModelCatalog(backend.models())
        self._check_declarations()
        self.instance_id = options.instance_id or f"{self.identity.engine_name}-{uuid.uuid4().hex[:12]}"
        self.registry = RequestRegistry(options.finished_id_memory)
        self.admission = admission or Admission(options.max_in_flight, options.retry_after_ms)
        self.lifecycle = Lifecycle()
        self.health = HealthReporter(backend, self.lifecycle, self.identity.role,
                                     probe_timeout_s=options.probe_timeout_s)
        # adaptive coalescing of token messages under load (core.coalescing); None = off
        self.coalescer = (GroupingPolicy(options.coalesce_max_delay_ms / 1000, options.coalesce_loop_cpu)
                          if options.coalesce_max_delay_ms > 0 else None)
        self._loras = {}
        self._lora_lock = asyncio.Lock()
        self._cleanups = set()
        self.subscriptions = 0  # open KV and runtime event streams (each costs every engine step)
        self.watchdog = Watchdog(options.stall_timeout_s, options.progress_timeout_s,
                                 pending_work=lambda: len(self.registry), dead=self._engine_dead,
                                 on_engine_failure=self._end_all_streams,
                                 on_state_change=self._engine_state_changed,
                                 probe=self._probe_engine, probe_timeout_s=options.probe_timeout_s)
        self.health.watchdog = self.watchdog
        self.leniency = Leniency(options.ignored_options)  # what the v0.1.0 reading accepts, counted
        self.grpc_port: int | None = None  # the server's bound port, once it has one (native KV-event source)
        self.engine_died = asyncio.Event()  # set once the watchdog finds the engine dead (server.run exits)
        conn = backend.kv_connector()
        self._engine = EngineContext(
            role=self.identity.role,
            data_parallel_size=self.identity.parallelism.data_parallel_size or 1,
            loaded_loras=self._loras,
            transfer_backend=conn.transfer_backend if conn is not None else "",
            local_decode_refusal=backend.local_decode_refusal,
        )

    def _check_declarations(self) -> None:
        """A model card may only advertise what the backend implements, within the spec's
        discovery rules (no UNSPECIFIED in lists, limits > 0): a bad card stops start-up."""
        features = self.backend.features
        for card in self.catalog.cards:
            problems = model_messages.card_problems(card)
            if problems:
                raise ValueError(f"model card {card.model_id!r} breaks the contract: {'; '.join(problems)}")
            tasks = card.tasks
            for task, feature in (("embed", Feature.EMBED), ("classify", Feature.CLASSIFY),
                                  ("score", Feature.SCORE)):
                cap = getattr(tasks, task, None) if tasks else None
                if cap is not None and cap.supported and feature not in features:
                    raise ValueError(f"model {card.model_id} advertises {task} without {feature}")
            if card.supports_lora and Feature.LORA not in features:
                raise ValueError(f"model {card.model_id} advertises LoRA without Feature.LORA")

    async def start(self) -> None:
        if self.coalescer is not None:
            self.coalescer.start()
        await self.backend.start()
        if Feature.LORA in self.backend.features:
            for adapter in await self.backend.list_loras():
                self._loras[adapter.lora_name] = adapter
        self.watchdog.start()

    def _engine_state_changed(self) -> None:
        if self.watchdog.dead_reason:
            self.engine_died.set()
        self._background(self.health.refresh())

    async def _probe_engine(self) -> None:
        """The watchdog's probe of a hung engine: the Health probe of the first model, this role."""
        await self.backend.probe(self.catalog.cards[0].names[0], self.identity.role)

    def _engine_dead(self) -> str | None:
        try:
            return self.backend.dead()
        except Exception as exc:  # a broken hook is a dead engine's symptom, never a crash
            return f"the engine's liveness check failed: {exc}"

    def _end_all_streams(self, failure: EngineFailure) -> None:
        """A hung or dead engine: every request and subscription ends with ``failure`` (retryable)."""
        for entry in self.registry.live():
            entry.mark_aborted(failure.code, failure.message)
        for watch in list(self.watchdog.streams):
            watch.interrupt(failure)

