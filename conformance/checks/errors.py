"""The two error transports: a rejection before acceptance is a non-OK status (and, where the server
sends the ``openengine-error-bin`` trailer, its EngineError agrees with that status)."""

from __future__ import annotations

import grpc

from conformance.registry import check
from openengine_adapters.v1 import lifecycle_pb2, model_pb2

C = grpc.StatusCode


@check("errors.rejection_trailer", "always")
async def rejection_trailer(ctx):
    """"Before request acceptance: Non-OK gRPC status, No response event". Every rejection the suite
    provokes is also checked for its machine-readable twin where the server sends one
    (``openengine-error-bin``: an EngineError, code not UNSPECIFIED and naming the status's failure --
    INVALID_ARGUMENT/UNSUPPORTED_FEATURE for INVALID_ARGUMENT, *_NOT_FOUND for NOT_FOUND, OVERLOADED for
    RESOURCE_EXHAUSTED -- retry_after_ms only when retryable); this check provokes one of each kind on any
    target."""
    await ctx.rejected(ctx.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="conformance/no-such-model"),
                                             timeout=30), C.NOT_FOUND, what="GetModelInfo(unknown)")
    await ctx.rejected(ctx.stub.Abort(lifecycle_pb2.AbortRequest(), timeout=30), C.INVALID_ARGUMENT, what="Abort()")
    if ctx.role == 1 and ctx.generates():
        req = ctx.request("trailer")
        req.stopping.max_tokens = 0
        await ctx.gen_rejected(req, what="max_tokens 0")
