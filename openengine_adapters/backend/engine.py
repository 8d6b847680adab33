"""The engine: who it is (``EngineIdentity``, sent as ``EngineInfo``) and ``EngineBackend``, the
interface every adapter implements and the core calls.

The service validates every request against the backend's ``ModelCard`` before calling in, so a
backend only sees requests it declared it can serve.

Contract for ``generate``: awaiting it may raise ``RequestRejected`` (not accepted, the client gets
a status); once it returns, the request is accepted and the returned async iterator yields
``GenerationChunk``s until every output finished (or, for a prefill, ``prefill_ready`` is set).
After ``abort`` the stream must end promptly; outputs it did not finish are reported CANCELLED by
the service. Raise ``EngineFailure`` for an accepted request that fails.
"""

from __future__ import annotations

import abc
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openengine_adapters.backend.generation import ExtraKey, GenerateParams, GenerationChunk, Sampling, Stopping
from openengine_adapters.backend.kv import KvConnector, KvEventBatchData, KvEventSourceInfo, KvSession
from openengine_adapters.backend.model import LoraAdapterInfo, ModelCard
from openengine_adapters.backend.observability import HealthCheckResult, LoadSnapshot, RuntimeEventData
from openengine_adapters.backend.tasks import (
    ClassifyParams,
    ClassifyResult,
    EmbedParams,
    EmbedResult,
    ScoreParams,
    ScoreResult,
)
from openengine_adapters.types import EngineRole, Feature, RuntimeEventType


@dataclass(frozen=True)
class Parallelism:
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    data_parallel_rank: int | None = None
    data_parallel_start_rank: int | None = None
    # v0.1.0 only (revision 1's ParallelismInfo has no such field)
    decode_context_parallel_size: int | None = field(default=None, metadata={"wire": False})


@dataclass(frozen=True)
class EngineIdentity:
    engine_name: str
    engine_version: str
    role: EngineRole = EngineRole.AGGREGATED
    parallelism: Parallelism = field(default_factory=Parallelism)
    max_loras: int | None = None  # resident LoRA adapters at once (v0.1.0 DeploymentCapacity)
    # engine-specific server metadata with no portable field (v0.1.0 ServerInfo.extra)
    extra: Mapping[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- the interface


class EngineBackend(abc.ABC):
    """One engine behind the OpenEngine service.

    ``features`` declares which optional method groups are implemented; the service answers
    UNIMPLEMENTED for the rest without calling them.
    """

    features: frozenset[Feature] = frozenset()
    # the engine-specific GenerateRequest.extra keys (v0.1.0) this adapter applies, by name; the
    # service refuses a known key of the wrong type and ignores unknown keys, as the spec says
    request_extra: Mapping[str, ExtraKey] = {}
    # why this engine's DECODE role cannot serve a request without a KV session (v0.1.0 conditional
    # disaggregation, validation.leniency); None: it serves it as a local request
    local_decode_refusal: str | None = None

    # identity and discovery ------------------------------------------------
    @abc.abstractmethod
    def identity(self) -> EngineIdentity: ...

    @abc.abstractmethod
    def models(self) -> Sequence[ModelCard]:
        """Every served model; the first is the default."""

    def kv_connector(self) -> KvConnector | None:
        """The configured KV connector, ``None`` when the engine has none."""
        return None

    # lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Called once before the server accepts calls."""

    async def shutdown(self) -> None:
        """Called once after the server stopped."""

    async def check_health(self) -> list[HealthCheckResult]:
        """Cheap liveness checks (scheduler, model, kv_connector...); never raises."""
        return []

    def dead(self) -> str | None:
        """Why the engine can serve nothing more (its process died), or None while it lives. Polled
        by the server's watchdog (cheap, never raises): a reason ends every open stream and
        subscription with one terminal retryable error and turns Health NOT_READY."""
        return None

    async def probe(self, model: str, role: EngineRole) -> None:
        """A minimal role-appropriate inference; raise to report failure.

        The default runs a 1-token generation (AGGREGATED) or a 1-token prefill whose KV session
        is released at once (PREFILL). A DECODE probe needs a session, so adapters that can
        decode without one override this.
        """
        if role == EngineRole.DECODE:
            raise RuntimeError("this adapter has no decode probe without a KV session")
        stream = await self.generate(
            GenerateParams(
                request_id=f"openengine-health-probe-{time.monotonic_ns()}",
                model=model,
                token_ids=(1,),
                sampling=Sampling(temperature=0.0),
                stopping=Stopping(max_tokens=1, ignore_eos=True),
            )
        )
        produced, session = 0, None
        async for chunk in stream:
            produced += sum(len(o.token_ids) for o in chunk.outputs)
            session = chunk.prefill_ready or session
        if role == EngineRole.PREFILL:
            if session is None:
                raise RuntimeError("prefill probe ended without a KV session")
            await self.release_kv_session(session)
        elif produced < 1:
            raise RuntimeError("probe produced no token")

    # generation and tasks ------------------------------------------------------
    async def validate_generate(self, params: GenerateParams) -> None:
        """Engine-specific checks before acceptance; raise ``RequestRejected``."""

    async def generate(self, params: GenerateParams) -> AsyncIterator[GenerationChunk]:
        """Submit the request (may raise ``RequestRejected``) and return its chunk stream."""
        raise NotImplementedError

    async def embed(self, params: EmbedParams) -> EmbedResult:
        raise NotImplementedError

    async def classify(self, params: ClassifyParams) -> ClassifyResult:
        raise NotImplementedError

    async def score(self, params: ScoreParams) -> ScoreResult:
        raise NotImplementedError

    async def abort(self, request_ids: Sequence[str]) -> None:
        """Stop the engine work of these requests (already-finished ids are ignored)."""
        raise NotImplementedError

    async def release_kv_session(self, session: KvSession) -> bool:
        """Free engine-held KV state of a session; ``False`` when the engine does not know it."""
        return False

    def open_kv_sessions(self) -> int | None:
        """Sessions the engine still holds KV for; ``None`` when unknown."""
        return None

    # load and events -----------------------------------------------------------
    async def load(self, per_rank: bool) -> LoadSnapshot:
        raise NotImplementedError

    def kv_event_sources(self, ranks: Sequence[int]) -> list[KvEventSourceInfo]:
        raise NotImplementedError

    def kv_events(
        self, ranks: Sequence[int], include_snapshot: bool, start_sequence_number: int
    ) -> AsyncIterator[KvEventBatchData]:
        """Typed KV batches; raise ``EngineFailure`` to end the subscription with an error."""
        raise NotImplementedError

    def runtime_events(self, types: Sequence[RuntimeEventType]) -> AsyncIterator[RuntimeEventData]:
        """Runtime events of these types (all when empty); ``EngineFailure`` ends the stream."""
        raise NotImplementedError

    # LoRA ----------------------------------------------------------------------
    async def load_lora(self, adapter: LoraAdapterInfo) -> None:
        """Load and validate the adapter (the service has checked the spec's rules)."""
        raise NotImplementedError

    async def unload_lora(self, adapter: LoraAdapterInfo) -> None:
        raise NotImplementedError

    async def list_loras(self) -> list[LoraAdapterInfo]:
        return []
