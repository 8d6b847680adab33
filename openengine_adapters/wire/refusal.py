"""Refusing a call before any handler of ours runs, in the calling surface's own words.

The security interceptor and the request decoders end calls that never reach the core (a missing
token, bytes that do not decode). The client still gets what the contract promises for every
refusal: a status plus the ``openengine-error-bin`` trailer, encoded as the EngineError of the
surface it called (revision 1's, or v0.1.0's with its own numbering). Other services (health,
reflection) get the status alone.
"""

from __future__ import annotations

import grpc

from openengine_adapters.core.service import rejection_trailer
from openengine_adapters.errors import ERROR_TRAILER, RequestRejected

REVISION1_PREFIX = "/openengine.v1.OpenEngine/"
V0_1_PREFIXES = ("/openengine.v1.Inference/", "/openengine.v1.Control/")


def trailer(method: str, r: RequestRejected) -> tuple[tuple[str, str | bytes], ...]:
    """The refusal's trailing metadata for a call of ``method`` (a full ``/service/Method`` name)."""
    if method.startswith(V0_1_PREFIXES):
        from openengine_adapters.wire.v0_1 import translate  # v0.1.0's EngineError numbering

        return tuple((k, translate.error_trailer(v) if k == ERROR_TRAILER else v) for k, v in rejection_trailer(r))
    if method.startswith(REVISION1_PREFIX):
        return rejection_trailer(r)
    return ()


async def refuse(context: grpc.aio.ServicerContext, method: str, r: RequestRejected):
    await context.abort(r.status, r.message, trailing_metadata=trailer(method, r))


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
