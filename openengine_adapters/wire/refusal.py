"""Every refusal on the wire, in the calling surface's own words: one home for the status and trailer.

A refusal is a status plus the ``openengine-error-bin`` trailer, encoded as the EngineError of the
surface called (revision 1's, or v0.1.0's with its own numbering). The core raises
``RequestRejected`` (or any exception) for a call it refuses, and the handler every RPC is
registered with (``wire.decode.method_handler``) turns that into the refusal; the security
interceptor and the request decoders refuse calls that never reach the core the same way. Other
services (health, reflection) get the status alone.
"""

from __future__ import annotations

import logging

import grpc

from openengine_adapters.core.stream import engine_error
from openengine_adapters.errors import (
    ERROR_TRAILER,
    RETRY_AFTER_TRAILER,
    EngineFailure,
    RequestRejected,
    refusal,
)

log = logging.getLogger(__name__)

REVISION1_PREFIX = "/openengine.v1.OpenEngine/"
V0_1_PREFIXES = ("/openengine.v1.Inference/", "/openengine.v1.Control/")


def rejection_trailer(r: RequestRejected) -> tuple[tuple[str, str | bytes], ...]:
    """The machine-readable EngineError trailer (and the retry hint) of a refusal (revision 1's encoding)."""
    err = engine_error(EngineFailure(r.code, r.message, retryable=r.retryable,
                                     retry_after_ms=r.retry_after_ms, details=r.details))
    trailer: list[tuple[str, str | bytes]] = [(ERROR_TRAILER, err.SerializeToString())]
    if r.retry_after_ms is not None:
        trailer.append((RETRY_AFTER_TRAILER, str(r.retry_after_ms)))
    return tuple(trailer)


def trailer(method: str, r: RequestRejected) -> tuple[tuple[str, str | bytes], ...]:
    """The refusal's trailing metadata for a call of ``method`` (a full ``/service/Method`` name)."""
    if method.startswith(V0_1_PREFIXES):
        from openengine_adapters.wire.v0_1 import server_mapping  # v0.1.0's EngineError numbering

        return tuple((k, server_mapping.error_trailer(v) if k == ERROR_TRAILER else v) for k, v in rejection_trailer(r))
    if method.startswith(REVISION1_PREFIX):
        return rejection_trailer(r)
    return ()


async def refuse(context: grpc.aio.ServicerContext, method: str, r: RequestRejected):
    await context.abort(r.status, r.message, trailing_metadata=trailer(method, r))


async def refuse_raised(context: grpc.aio.ServicerContext, method: str, exc: Exception):
    """Refuse the call with what a handler raised before its first response (``refusal``'s mapping)."""
    if not isinstance(exc, RequestRejected | EngineFailure):  # a backend bug too: a status, never a crash
        log.exception("%s failed", method)
    await refuse(context, method, refusal(exc))


def refusing_handler(like: grpc.RpcMethodHandler, method: str, r: RequestRejected) -> grpc.RpcMethodHandler:
    """A handler of ``like``'s kind that refuses every call with ``r``, without decoding the request."""
    async def unary(request, context):
        await refuse(context, method, r)

    async def streaming(request, context):
        await refuse(context, method, r)
        yield  # pragma: no cover - makes this an async generator; abort raises first

    if like.request_streaming and like.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming)
    if like.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary)
    if like.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming)
    return grpc.unary_unary_rpc_method_handler(unary)
