"""The server interceptor that authenticates every call and guards the operator RPCs.

Authentication needs only the call's metadata, so a refused caller's request bytes are never
decoded. The operator rule also needs the peer address (and for Abort the decoded target), which
only the handler sees: those few handlers are wrapped, every other one is returned untouched, so
Generate's per-token path carries no extra layer.
"""

from __future__ import annotations

import functools

import grpc

from openengine_adapters.errors import unauthenticated
from openengine_adapters.security.policy import (
    ABORT_METHODS,
    OPERATOR_METHODS,
    UNAUTHENTICATED_PREFIXES,
    OperatorPolicy,
)
from openengine_adapters.security.tokens import Caller, TokenSet
from openengine_adapters.wire.decode import Undecodable
from openengine_adapters.wire.refusal import refuse, refusing_handler


class SecurityInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: TokenSet, policy: OperatorPolicy) -> None:
        self.tokens = tokens
        self.policy = policy

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(UNAUTHENTICATED_PREFIXES):
            return handler
        caller = self.tokens.identify(handler_call_details.invocation_metadata)
        if caller == Caller.INVALID or (caller == Caller.ANONYMOUS and self.tokens.clients_need_key):
            return refusing_handler(handler, method, unauthenticated(
                "send a valid API key as 'authorization: Bearer <key>'" if caller == Caller.ANONYMOUS
                else "the API key in 'authorization' is not valid on this server"))
        if method in OPERATOR_METHODS:
            return self._guard(handler, method, caller, lambda request: True)
        if method in ABORT_METHODS:
            # an undecodable request is left to the handler, which refuses it (wire.decode)
            return self._guard(handler, method, caller, lambda request: type(request) is not Undecodable
                               and request.WhichOneof("target") == "all_requests")
        return handler

    def _guard(self, handler: grpc.RpcMethodHandler, method: str, caller: Caller, is_operator_call):
        """``handler`` with the operator rule checked first, for requests ``is_operator_call`` picks."""
        what = method.rsplit("/", 1)[-1] + (" of all requests" if method in ABORT_METHODS else "")
        policy = self.policy

        if handler.response_streaming:
            inner = handler.unary_stream

            @functools.wraps(inner)
            async def streaming(request, context):
                refusal = is_operator_call(request) and policy.refusal(caller, context.peer(), what)
                if refusal:
                    await refuse(context, method, refusal)
                async for response in inner(request, context):
                    yield response

            return handler._replace(unary_stream=streaming)
        inner = handler.unary_unary

        @functools.wraps(inner)
        async def unary(request, context):
            refusal = is_operator_call(request) and policy.refusal(caller, context.peer(), what)
            if refusal:
                await refuse(context, method, refusal)
            return await inner(request, context)

        return handler._replace(unary_unary=unary)
