"""The client side: a grpc.aio channel with TLS or mTLS and a bearer token, for the typed client
and the conformance suite.

The token travels as ``authorization: Bearer <token>`` metadata added by a client interceptor
rather than as gRPC call credentials, which gRPC refuses on a plaintext channel: a token on
loopback without TLS is a normal development setup.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

import grpc

from openengine_adapters.security.tls import channel_credentials


class _Bearer:
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self._header)
        return details._replace(metadata=metadata)


# grpc.aio files each interceptor under the first call kind it implements: one class per kind
class _UnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _UnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _StreamUnary(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def open_channel(target: str, *, credentials: grpc.ChannelCredentials | None = None, tls: bool = False,
                 ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                 token: str | None = None, options: Iterable[tuple[str, object]] = ()) -> grpc.aio.Channel:
    """Plaintext unless ``credentials``, ``tls`` or a TLS file is given (``ca_file`` else the system
    roots; ``cert_file``/``key_file`` for mTLS); ``token`` adds the bearer header to every call."""
    interceptors = [kind(token) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)] if token else None
    if credentials is None and (tls or ca_file or cert_file or key_file):
        credentials = channel_credentials(ca_file, cert_file, key_file)
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=list(options), interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)


def add_client_args(parser: argparse.ArgumentParser, token_note: str = "") -> None:
    """The TLS and token options of our clients (``openengine``, ``python -m conformance``)."""
    parser.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's CA roots")
    parser.add_argument("--tls-ca-file", help="connect with TLS, trusting this PEM CA bundle")
    parser.add_argument("--tls-cert-file", help="mTLS: the client certificate (PEM) to present")
    parser.add_argument("--tls-key-file", help="mTLS: the client certificate's key (PEM)")
    parser.add_argument("--token", default=os.environ.get("OPENENGINE_API_KEY"),
                        help="bearer token sent as 'authorization: Bearer TOKEN' (default: $OPENENGINE_API_KEY)"
                             + token_note)
