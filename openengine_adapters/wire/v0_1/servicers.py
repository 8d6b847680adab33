"""v0.1.0 on the wire: ``Inference`` and ``Control``, translated at this boundary onto the core.

Every call runs in the same ``EngineService`` as revision 1 (one request table, admission, drain and
KV-session table). Requests are checked for the v0.1.0-only rules here (metadata keys, ``extra``,
MODALITY_UNSPECIFIED), translated, and handed to the core; what is refused here or in the core
reaches the client with v0.1.0's EngineError in the ``openengine-error-bin`` trailer (``wire.refusal``).

The handlers are registered by hand (``register``) rather than through the generated
``add_*Servicer_to_server``: wire-identical messages cross as their revision-1 twins
(``server_mapping.PASSTHROUGH``), responses are serialized by whatever message they are, and bytes that
do not decode are refused INVALID_ARGUMENT with the trailer (``wire.decode``).
"""

from __future__ import annotations

import importlib.metadata

import grpc

from openengine_adapters import schema
from openengine_adapters.core.service import EngineService
from openengine_adapters.errors import invalid
from openengine_adapters.messages import model as model_messages
from openengine_adapters.types import EngineRole
from openengine_adapters.v0_1 import (
    generation_pb2,
    kv_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    openengine_pb2,
    server_pb2,
)
from openengine_adapters.validation.extra import describe, request_struct
from openengine_adapters.validation.generate import check_dp_rank
from openengine_adapters.wire.decode import method_handler
from openengine_adapters.wire.v0_1 import metadata, server_mapping

INFERENCE = openengine_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
CONTROL = openengine_pb2.DESCRIPTOR.services_by_name["Control"].full_name


def adapter_version() -> str:
    try:
        return importlib.metadata.version("openengine-adapters")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class InferenceServicer:
    def __init__(self, core: EngineService) -> None:
        self.core = core

    def _to_core(self, request: generation_pb2.GenerateRequest, context):
        meta = metadata.parse_inference(context.invocation_metadata())
        core = self.core
        # a priority the model does not schedule by is served in default order (validation.leniency)
        if meta.target_dp_rank is not None:
            # the core checks the range again as kv.data_parallel_rank, a field v0.1.0 does not have
            check_dp_rank(meta.target_dp_rank, core.identity.parallelism.data_parallel_size or 1,
                          metadata.TARGET_DP_RANK)
            session = request.kv.session if request.kv.HasField("session") else None
            if session is not None and session.dp_rank != meta.target_dp_rank:
                raise invalid(f"{metadata.TARGET_DP_RANK}: {meta.target_dp_rank} disagrees with "
                              f"kv.session.dp_rank {session.dp_rank} (the session's rank is authoritative)")
        core_request = server_mapping.generate_request(request, priority=meta.priority,
                                                       target_dp_rank=meta.target_dp_rank, application=meta.application)
        extra = request_struct(request.extra, "extra") if request.HasField("extra") else None
        return core_request, extra, meta.trace_headers

    async def Generate(self, request: generation_pb2.GenerateRequest, context):
        core_request, extra, trace = self._to_core(request, context)
        async for response in self.core.Generate(core_request, context, extra, trace, lenient=True):
            # every event but an error is already v0.1.0's bytes (server_mapping's docstring)
            yield server_mapping.generate_error(response) if response.HasField("error") else response


class ControlServicer:
    def __init__(self, core: EngineService, served_services: tuple[str, ...],
                 kv_block_hash_encoding: str = server_mapping.INT64) -> None:
        self.core = core
        self.served_services = served_services
        self.kv_block_hash_encoding = kv_block_hash_encoding  # --kv-block-hash-encoding

    def server_extra(self) -> dict:
        extra = {"adapter": "openengine-adapters", "adapter_version": adapter_version(),
                 "services": list(self.served_services)}
        if "openengine.v1.OpenEngine" in self.served_services:
            extra["revision1_schema_release"] = schema.SCHEMA_RELEASE
        if self.core.identity.role == EngineRole.DECODE:  # conditional disaggregation (validation.leniency)
            refusal = self.core.backend.local_decode_refusal
            extra["decode_without_kv_session"] = f"refused: {refusal}" if refusal else "served"
        return {**self.core.identity.extra, **extra}

    async def GetServerInfo(self, request, context):
        core = self.core
        info = await core.GetEngineInfo(None, context)
        cards = core.catalog.cards
        return server_mapping.server_info(info, core.identity, cards[0] if cards else None,
                                     schema.V0_1_SCHEMA_RELEASE, self.server_extra())

    async def GetModelInfo(self, request, context):
        core = self.core
        card = core.catalog.resolve(request.model, required=True)
        extra = dict(card.extra)
        ignored = card.generation.ignored_options if card.generation else ()
        if ignored:  # options the engine accepts and does not apply; what this server does with them
            extra["ignored_options"] = {f"sampling.{o.name}": o.reason for o in ignored}
            extra["ignored_options_policy"] = core.leniency.ignored_options
        if core.backend.request_extra:
            extra["request_extra_keys"] = describe(core.backend.request_extra)
        if card.tasks is not None:
            tasks = [name for name in ("embed", "classify", "score")
                     if getattr(card.tasks, name) is not None and getattr(card.tasks, name).supported]
            if tasks and "openengine.v1.OpenEngine" in self.served_services:
                extra["revision1_tasks"] = tasks  # Embed/Classify/Score are served on revision 1
        return server_mapping.model_info(model_messages.model_info(card, core.identity.role, lenient=True), extra)

    async def GetLoad(self, request, context):
        return server_mapping.load_info(await self.core.load_snapshot(request.include_per_rank), self.core.instance_id)

    async def Health(self, request, context):
        return server_mapping.health_response(await self.core.Health(request, context))

    async def Abort(self, request, context):
        return await self.core.Abort(request, context)

    async def LoadLora(self, request, context):
        return await self.core.LoadLora(request, context)

    async def UnloadLora(self, request, context):
        return await self.core.UnloadLora(request, context)

    async def ListLoras(self, request, context):
        return await self.core.ListLoras(request, context)

    async def GetKvEventSources(self, request, context):
        return self.core.kv_event_sources(request, native=True)

    async def SubscribeKvEvents(self, request, context):
        async for response in self.core.SubscribeKvEvents(request, context):
            yield server_mapping.kv_events_error(response.error) if response.HasField("error") else \
                server_mapping.kv_events_batch(response, self.kv_block_hash_encoding)


def _handler(service: str, name: str, method, request_type, response_streaming: bool = False):
    return method_handler(f"/{service}/{name}", method, request_type, response_streaming)


def _twin(v0_1_type):
    return server_mapping.PASSTHROUGH[v0_1_type]


def register(core: EngineService, server: grpc.aio.Server, served_services: tuple[str, ...],
             kv_block_hash_encoding: str = server_mapping.INT64) -> tuple[str, ...]:
    """Serve ``openengine.v1.Inference`` and ``openengine.v1.Control`` from ``core``."""
    inference, control = InferenceServicer(core), ControlServicer(core, served_services, kv_block_hash_encoding)
    handlers = {
        INFERENCE: {"Generate": _handler(INFERENCE, "Generate", inference.Generate, generation_pb2.GenerateRequest,
                                         response_streaming=True)},
        CONTROL: {
            name: _handler(CONTROL, name, getattr(control, name), request_type, name == "SubscribeKvEvents")
            for name, request_type in (
                ("GetServerInfo", server_pb2.GetServerInfoRequest),
                ("GetModelInfo", _twin(model_pb2.GetModelInfoRequest)),
                ("GetLoad", _twin(server_pb2.GetLoadRequest)),
                ("Health", _twin(lifecycle_pb2.HealthRequest)),
                ("Abort", _twin(lifecycle_pb2.AbortRequest)),
                ("LoadLora", _twin(lora_pb2.LoadLoraRequest)),
                ("UnloadLora", _twin(lora_pb2.UnloadLoraRequest)),
                ("ListLoras", _twin(lora_pb2.ListLorasRequest)),
                ("GetKvEventSources", _twin(kv_pb2.GetKvEventSourcesRequest)),
                ("SubscribeKvEvents", _twin(kv_pb2.SubscribeKvEventsRequest)),
            )
        },
    }
    for service, methods in handlers.items():
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
    return INFERENCE, CONTROL
