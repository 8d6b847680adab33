"""Typed async client for openengine.v1, on either wire surface, that fails closed on an incompatible server.

``contract="revision-1"`` (default) speaks ``openengine.v1.OpenEngine``; ``contract="v0.1.0"`` speaks
upstream's released ``Inference`` + ``Control`` through the same revision-1-typed methods
(``wire.v0_1.stub``; RPCs v0.1.0 lacks raise ``NotOnSurface``). ``connect()`` reads the server's
identity and refuses a schema revision or release outside what this client was tested with for
that contract, or a server that requires a newer client. A call the server refuses (or cannot be
reached for) raises ``OpenEngineError`` (a ``grpc.aio.AioRpcError``) carrying the status, the message
and the ``EngineError`` of the ``openengine-error-bin`` trailer; its subclasses name the cases a
caller acts on: ``ServerUnreachable``, ``AuthenticationRefused``, ``NotFound``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterable

import grpc

from openengine_adapters import schema
from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.security.channel import open_channel
from openengine_adapters.v1 import (
    classification_pb2,
    embedding_pb2,
    engine_pb2,
    error_pb2,
    generation_pb2,
    kv_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    observability_pb2,
    openengine_pb2_grpc,
    scoring_pb2,
)
from openengine_adapters.wire.v0_1.stub import NotOnSurface, V01Stub

__all__ = ["AuthenticationRefused", "IncompatibleServer", "NotFound", "NotOnSurface", "OpenEngineClient",
           "OpenEngineError", "ServerUnreachable", "check_compatible"]

CLIENT_REVISION = schema.SCHEMA_REVISION
TESTED_SERVER_REVISIONS = range(1, 2)
TESTED_RELEASES = frozenset({schema.SCHEMA_RELEASE})
# the schema release each contract surface was tested with
TESTED_RELEASES_BY_CONTRACT = {"revision-1": TESTED_RELEASES,
                               "v0.1.0": frozenset({schema.V0_1_SCHEMA_RELEASE})}


class IncompatibleServer(RuntimeError):
    """The server's advertised contract is outside this client's tested range."""


class OpenEngineError(grpc.aio.AioRpcError):
    """A call the server refused or failed: ``status`` (a ``grpc.StatusCode``), ``message``, and
    ``engine_error``, the contract's ``EngineError`` from the ``openengine-error-bin`` trailer (None
    when the server sent none: a transport failure, an RPC the server lacks)."""

    def __init__(self, exc: grpc.aio.AioRpcError) -> None:
        super().__init__(exc.code(), exc.initial_metadata(), exc.trailing_metadata(), exc.details(),
                         exc.debug_error_string())
        self.status = exc.code()
        self.message = exc.details() or ""
        self.engine_error = engine_error_of(exc.trailing_metadata())

    def __str__(self) -> str:
        return f"{self.status.name}: {self.message}"


class ServerUnreachable(OpenEngineError):
    """No server answered (UNAVAILABLE before any response): not running, wrong address, or a TLS
    mismatch (a TLS client on a plaintext server, an untrusted certificate, plaintext on TLS)."""


class AuthenticationRefused(OpenEngineError):
    """UNAUTHENTICATED (no key, or a wrong one) or PERMISSION_DENIED (a key without the right)."""


class NotFound(OpenEngineError):
    """NOT_FOUND: an unknown model, request id, LoRA adapter or KV session."""


def engine_error_of(trailing_metadata) -> error_pb2.EngineError | None:
    for key, value in trailing_metadata or ():
        if key == ERROR_TRAILER and isinstance(value, bytes):
            try:
                return error_pb2.EngineError.FromString(value)
            except Exception:  # a malformed trailer is no EngineError
                return None
    return None


def typed_error(exc: grpc.aio.AioRpcError) -> OpenEngineError:
    if isinstance(exc, OpenEngineError):
        return exc
    kind = {grpc.StatusCode.UNAVAILABLE: ServerUnreachable, grpc.StatusCode.UNAUTHENTICATED: AuthenticationRefused,
            grpc.StatusCode.PERMISSION_DENIED: AuthenticationRefused,
            grpc.StatusCode.NOT_FOUND: NotFound}.get(exc.code(), OpenEngineError)
    if kind is ServerUnreachable and engine_error_of(exc.trailing_metadata()) is not None:
        kind = OpenEngineError  # a server answered (draining, an engine gone): reachable
    return kind(exc)


class _TypedStream:
    """A streaming call whose refusal is raised as an ``OpenEngineError``."""

    def __init__(self, call) -> None:
        self._call = call

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        try:
            async for item in self._call:
                yield item
        except grpc.aio.AioRpcError as exc:
            raise typed_error(exc) from None

    async def read(self):
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise typed_error(exc) from None

    def __getattr__(self, name):  # cancel, code, details, trailing_metadata, done ...
        return getattr(self._call, name)


class _TypedStub:
    """The stub with every call's refusal raised as an ``OpenEngineError``."""

    def __init__(self, stub) -> None:
        self._stub = stub

    def __getattr__(self, name):
        method = getattr(self._stub, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            result = method(*args, **kwargs)
            if hasattr(result, "__aiter__"):
                return _TypedStream(result)
            if inspect.isawaitable(result):
                async def unary():
                    try:
                        return await result
                    except grpc.aio.AioRpcError as exc:
                        raise typed_error(exc) from None
                return unary()
            return result
        return call


def check_compatible(info: engine_pb2.EngineInfo, revisions: range = TESTED_SERVER_REVISIONS,
                     releases: Iterable[str] = TESTED_RELEASES) -> None:
    if info.schema_revision == 0:
        raise IncompatibleServer("server reports schema_revision 0 (invalid)")
    if info.schema_revision not in revisions:
        raise IncompatibleServer(f"server schema_revision {info.schema_revision} is outside the tested "
                                 f"range {revisions.start}..{revisions.stop - 1}")
    if info.minimum_client_revision > CLIENT_REVISION:
        raise IncompatibleServer(f"server requires client revision >= {info.minimum_client_revision}, "
                                 f"this client is revision {CLIENT_REVISION}")
    if info.schema_release not in frozenset(releases):
        raise IncompatibleServer(f"server schema_release {info.schema_release!r} is not a tested release")


class OpenEngineClient:
    def __init__(self, target: str, *, credentials: grpc.ChannelCredentials | None = None,
                 options: Iterable[tuple[str, object]] = (), contract: str = "revision-1",
                 tls: bool = False, tls_ca_file: str | None = None, tls_cert_file: str | None = None,
                 tls_key_file: str | None = None, token: str | None = None) -> None:
        """TLS when ``credentials``, ``tls`` or a TLS file is given: ``tls_ca_file`` is the CA to trust
        (else the system roots), ``tls_cert_file``/``tls_key_file`` the client certificate for mTLS;
        ``token`` is sent as ``authorization: Bearer <token>`` on every call."""
        if contract not in TESTED_RELEASES_BY_CONTRACT:
            raise ValueError(f"contract: {contract!r} is not one of {', '.join(TESTED_RELEASES_BY_CONTRACT)}")
        self.target = target
        self.contract = contract
        self.channel = open_channel(target, credentials=credentials, tls=tls, ca_file=tls_ca_file,
                                    cert_file=tls_cert_file, key_file=tls_key_file, token=token, options=options)
        self.stub = _TypedStub(openengine_pb2_grpc.OpenEngineStub(self.channel) if contract == "revision-1"
                               else V01Stub(self.channel))
        self.engine_info: engine_pb2.EngineInfo | None = None

    async def connect(self, timeout: float | None = 10.0) -> engine_pb2.EngineInfo:
        """Fetch and check the server's identity (EngineInfo, or v0.1.0's ServerInfo seen as one);
        raises IncompatibleServer (and closes) when out of range."""
        info = await self.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=timeout)
        try:
            check_compatible(info, releases=TESTED_RELEASES_BY_CONTRACT[self.contract])
        except IncompatibleServer:
            await self.close()
            raise
        self.engine_info = info
        return info

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> OpenEngineClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # generation and tasks
    def generate(self, request: generation_pb2.GenerateRequest, timeout: float | None = None
                 ) -> AsyncIterator[generation_pb2.GenerateResponse]:
        return self.stub.Generate(request, timeout=timeout)

    async def embed(self, request: embedding_pb2.EmbedRequest, timeout: float | None = None):
        return await self.stub.Embed(request, timeout=timeout)

    async def classify(self, request: classification_pb2.ClassifyRequest, timeout: float | None = None):
        return await self.stub.Classify(request, timeout=timeout)

    async def score(self, request: scoring_pb2.ScoreRequest, timeout: float | None = None):
        return await self.stub.Score(request, timeout=timeout)

    # discovery
    async def get_model_info(self, model: str) -> model_pb2.ModelInfo:
        return await self.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=model))

    async def get_load(self, include_per_rank: bool = False) -> observability_pb2.LoadInfo:
        return await self.stub.GetLoad(observability_pb2.GetLoadRequest(include_per_rank=include_per_rank))

    # lifecycle
    async def health(self, include_inference_probe: bool = False, model: str = "",
                     role: int = 0) -> lifecycle_pb2.HealthResponse:
        return await self.stub.Health(lifecycle_pb2.HealthRequest(
            include_inference_probe=include_inference_probe, model=model, role=role))

    async def abort(self, request_id: str | None = None, *, kv_session: kv_pb2.KvSessionRef | None = None,
                    all_requests: bool = False) -> lifecycle_pb2.AbortResponse:
        targets = [request_id is not None, kv_session is not None, all_requests]
        if sum(targets) != 1:
            raise ValueError("abort takes exactly one of request_id, kv_session, all_requests")
        if request_id is not None:
            req = lifecycle_pb2.AbortRequest(request_id=request_id)
        elif kv_session is not None:
            req = lifecycle_pb2.AbortRequest(kv_session=kv_session)
        else:
            req = lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests())
        return await self.stub.Abort(req)

    def drain(self, stop_accepting_new_requests: bool = True, deadline_ms: int | None = None,
              abort_after_deadline: bool = False) -> AsyncIterator[lifecycle_pb2.DrainResponse]:
        req = lifecycle_pb2.DrainRequest(stop_accepting_new_requests=stop_accepting_new_requests,
                                         abort_after_deadline=abort_after_deadline)
        if deadline_ms is not None:
            req.deadline_ms = deadline_ms
        return self.stub.Drain(req)

    # LoRA
    async def load_lora(self, lora_id: int, lora_name: str, source_path: str) -> lora_pb2.LoadLoraResponse:
        return await self.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
            lora_id=lora_id, lora_name=lora_name, source_path=source_path)))

    async def unload_lora(self, lora_name: str) -> lora_pb2.UnloadLoraResponse:
        return await self.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name=lora_name))

    async def list_loras(self) -> lora_pb2.ListLorasResponse:
        return await self.stub.ListLoras(lora_pb2.ListLorasRequest())

    # KV and runtime events
    async def get_kv_connector_info(self) -> kv_pb2.KvConnectorInfo:
        return await self.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest())

    async def get_kv_event_sources(self, ranks: Iterable[int] = ()) -> kv_pb2.GetKvEventSourcesResponse:
        return await self.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(
            data_parallel_ranks=list(ranks)))

    def subscribe_kv_events(self, ranks: Iterable[int] = (), include_snapshot: bool = False,
                            start_sequence_number: int = 0):
        return self.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(
            data_parallel_ranks=list(ranks), include_snapshot=include_snapshot,
            start_sequence_number=start_sequence_number))

    def subscribe_runtime_events(self, types: Iterable[int] = ()):
        return self.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest(
            types=list(types)))
