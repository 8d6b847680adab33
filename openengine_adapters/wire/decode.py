"""Request decoding that answers bad bytes the contract's way.

gRPC runs a method's deserializer before any handler; when it raises, the client gets UNKNOWN and
no trailer. Here the deserializer never raises: bytes that do not decode become an ``Undecodable``
stand-in, and the handler built by ``method_handler`` refuses it with INVALID_ARGUMENT and the
surface's ``openengine-error-bin`` trailer before the servicer sees anything. Every RPC of both
surfaces is registered through ``method_handler``, which also answers what the core raises as a
refusal (``wire.refusal``).
"""

from __future__ import annotations

import functools
from operator import methodcaller

import grpc
from google.protobuf.message import DecodeError

from openengine_adapters.errors import invalid
from openengine_adapters.wire.refusal import refuse, refuse_raised

_serialize = methodcaller("SerializeToString")


class Undecodable:
    """The request of a call whose bytes are not a valid ``message_name``."""

    __slots__ = ("message_name",)

    def __init__(self, message_name: str) -> None:
        self.message_name = message_name


def _deserializer(request_type):
    name, parse = request_type.DESCRIPTOR.full_name, request_type.FromString

    def deserialize(data: bytes):
        try:
            return parse(data)
        except (DecodeError, ValueError, RuntimeError):  # upb raises DecodeError; others have raised more
            return Undecodable(name)

    return deserialize


def _refusal(method: str, request: Undecodable):
    return invalid(f"request: the bytes sent to {method} do not decode as {request.message_name}")


def method_handler(method: str, behavior, request_type, response_streaming: bool) -> grpc.RpcMethodHandler:
    """A unary-request handler for ``method`` (``/service/Name``) around ``behavior(request, context)``.
    What ``behavior`` raises before its first response is refused in the surface's words
    (``refusal.refuse_raised``); after it, a stream ends with its own terminal event (the core's)."""
    if response_streaming:
        @functools.wraps(behavior)
        async def streaming(request, context):
            if type(request) is Undecodable:
                await refuse(context, method, _refusal(method, request))
            responses = behavior(request, context)
            try:
                first = await anext(responses)
            except StopAsyncIteration:
                return
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await refuse_raised(context, method, exc)
                return
            yield first
            async for response in responses:
                yield response

        return grpc.unary_stream_rpc_method_handler(streaming, request_deserializer=_deserializer(request_type),
                                                    response_serializer=_serialize)

    @functools.wraps(behavior)
    async def unary(request, context):
        if type(request) is Undecodable:
            await refuse(context, method, _refusal(method, request))
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await refuse_raised(context, method, exc)

    return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=_deserializer(request_type),
                                               response_serializer=_serialize)
