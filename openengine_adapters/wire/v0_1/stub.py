"""The v0.1.0 wire through revision-1 messages: a client-side stub with ``OpenEngineStub``'s methods.

It lets one revision-1-typed caller (the typed client, the conformance suite) drive a v0.1.0 server
(``Inference`` + ``Control``), translating each call as ``client_mapping`` says, in the client's
direction. RPCs that v0.1.0 does not have raise ``NotOnSurface`` without touching the network.
Rejections keep their status; their ``openengine-error-bin`` trailer is re-encoded as revision 1's
EngineError, so callers read one error type whichever surface they speak.
"""

from __future__ import annotations

import grpc

from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.v0_1 import kv_pb2, lifecycle_pb2, model_pb2, server_pb2
from openengine_adapters.v1 import kv_pb2 as rev1_kv_pb2
from openengine_adapters.v1 import lifecycle_pb2 as rev1_lifecycle_pb2
from openengine_adapters.v1 import lora_pb2 as rev1_lora_pb2
from openengine_adapters.wire.v0_1 import client_mapping

INFERENCE, CONTROL = "/openengine.v1.Inference/", "/openengine.v1.Control/"
REVISION1_ONLY = frozenset({"Embed", "Classify", "Score", "Drain", "GetKvConnectorInfo", "SubscribeRuntimeEvents"})


class NotOnSurface(RuntimeError):
    """The RPC exists in revision 1 only (v0.1.0 left it out)."""


def _error(exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    trailer = tuple((k, client_mapping.revision1_error_trailer(v) if k == ERROR_TRAILER else v)
                    for k, v in exc.trailing_metadata() or ())
    return grpc.aio.AioRpcError(exc.code(), exc.initial_metadata(), grpc.aio.Metadata(*trailer),
                                exc.details(), exc.debug_error_string())


class _Stream:
    """A server-streaming call whose responses and rejection are seen in revision 1's shape."""

    def __init__(self, call, convert) -> None:
        self._call, self._convert = call, convert

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        try:
            async for item in self._call:
                yield self._convert(item)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    async def read(self):
        try:
            item = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return item if item is grpc.aio.EOF else self._convert(item)

    def __getattr__(self, name):  # cancel, code, details, trailing_metadata, done ...
        return getattr(self._call, name)


def _kv_event(raw: bytes) -> rev1_kv_pb2.SubscribeKvEventsResponse:
    resp = rev1_kv_pb2.SubscribeKvEventsResponse.FromString(raw)
    if resp.HasField("error"):
        resp.error.CopyFrom(client_mapping.revision1_error(kv_pb2.SubscribeKvEventsResponse.FromString(raw).error))
    return resp


def _identity(raw: bytes) -> bytes:
    return raw


class V01Stub:
    """``OpenEngineStub``'s method names and revision-1 messages, on the v0.1.0 services."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._capacity: server_pb2.DeploymentCapacity | None = None

    def __getattr__(self, name):
        if name in REVISION1_ONLY:
            def missing(*_a, **_kw):
                raise NotOnSurface(f"{name} is not part of the v0.1.0 contract (revision 1 only)")
            return missing
        raise AttributeError(name)

    async def _unary(self, path, request, response_deserializer, **kw):
        call = self.channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=response_deserializer)
        try:
            return await call(request, **kw)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    def Generate(self, request, metadata=None, **kw):
        body, keys = client_mapping.v0_1_generate_request(request)
        call = self.channel.unary_stream(INFERENCE + "Generate", request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=_identity)
        return _Stream(call(body, metadata=tuple(keys) + tuple(metadata or ()), **kw),
                       client_mapping.revision1_generate_response)

    async def GetEngineInfo(self, request=None, **kw):
        info = await self._unary(CONTROL + "GetServerInfo", server_pb2.GetServerInfoRequest(),
                                 server_pb2.ServerInfo.FromString, **kw)
        self._capacity = info.capacity if info.HasField("capacity") else None
        return client_mapping.revision1_engine_info(info)

    async def GetServerInfo(self, **kw) -> server_pb2.ServerInfo:
        """v0.1.0's own ServerInfo (capacity and extra included)."""
        return await self._unary(CONTROL + "GetServerInfo", server_pb2.GetServerInfoRequest(),
                                 server_pb2.ServerInfo.FromString, **kw)

    async def GetModelInfo(self, request, **kw):
        mi = await self._unary(CONTROL + "GetModelInfo", request, model_pb2.ModelInfo.FromString, **kw)
        return client_mapping.revision1_model_info(mi, self._capacity)

    async def GetLoad(self, request, **kw):
        load = await self._unary(CONTROL + "GetLoad", request, server_pb2.LoadInfo.FromString, **kw)
        return client_mapping.revision1_load_info(load)

    async def Health(self, request, **kw):
        resp = await self._unary(CONTROL + "Health", request, lifecycle_pb2.HealthResponse.FromString, **kw)
        return client_mapping.revision1_health(resp)

    async def Abort(self, request, **kw):
        return await self._unary(CONTROL + "Abort", request, rev1_lifecycle_pb2.AbortResponse.FromString, **kw)

    async def LoadLora(self, request, **kw):
        return await self._unary(CONTROL + "LoadLora", request, rev1_lora_pb2.LoadLoraResponse.FromString, **kw)

    async def UnloadLora(self, request, **kw):
        return await self._unary(CONTROL + "UnloadLora", request, rev1_lora_pb2.UnloadLoraResponse.FromString, **kw)

    async def ListLoras(self, request, **kw):
        return await self._unary(CONTROL + "ListLoras", request, rev1_lora_pb2.ListLorasResponse.FromString, **kw)

    async def GetKvEventSources(self, request, **kw):
        return await self._unary(CONTROL + "GetKvEventSources", request,
                                 rev1_kv_pb2.GetKvEventSourcesResponse.FromString, **kw)

    def SubscribeKvEvents(self, request, **kw):
        call = self.channel.unary_stream(CONTROL + "SubscribeKvEvents",
                                         request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=_identity)
        return _Stream(call(request, **kw), _kv_event)
