"""The two error transports of the contract, as exceptions.

``RequestRejected`` is raised before acceptance and becomes a non-OK gRPC status. ``EngineFailure``
is raised after acceptance and becomes the single terminal ``EngineError`` of a stream (or, for a
unary RPC, which has no accepted phase, a non-OK status mapped from its code). Both carry the
``ErrorCode`` so clients get the same machine-readable error either way: a rejected call also
sends the serialized ``EngineError`` in the ``openengine-error-bin`` trailer.
"""

from __future__ import annotations

from typing import Any

import grpc

from openengine_adapters.types import ErrorCode

ERROR_TRAILER = "openengine-error-bin"
RETRY_AFTER_TRAILER = "retry-after-ms"
# A refusal's message travels twice in the trailers (grpc-message, percent-encoded: up to 3 bytes a
# byte; and inside the base64 EngineError), and gRPC clients refuse trailers over ~8 KiB. So every
# message (which may echo a request id, a path, a prompt fragment) is cut to this many UTF-8 bytes.
MAX_MESSAGE_BYTES = 1024


def bounded(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """``message`` cut to ``limit`` UTF-8 bytes (on a character boundary), saying how much was cut."""
    data = message.encode("utf-8", "replace")
    if len(data) <= limit:
        return message
    marker = f"... [{len(data) - limit + 40} more bytes]"
    return data[:limit - 40].decode("utf-8", "ignore") + marker

# The gRPC status that a post-acceptance code maps to where a status is needed (unary RPCs).
STATUS_FOR_CODE: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNSPECIFIED: grpc.StatusCode.UNKNOWN,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNSUPPORTED_FEATURE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.ROLE_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.MODEL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.REQUEST_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.DUPLICATE_REQUEST: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.KV_SESSION_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.KV_TRANSFER_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.DRAINING: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


class RequestRejected(Exception):
    """Refused before acceptance: the client gets ``status`` and nothing else happens."""

    def __init__(
        self,
        status: grpc.StatusCode,
        message: str,
        code: ErrorCode = ErrorCode.INVALID_ARGUMENT,
        *,
        retry_after_ms: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        message = bounded(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after_ms = retry_after_ms
        self.details = details or {}

    @property
    def retryable(self) -> bool:
        return self.retry_after_ms is not None


def invalid(message: str) -> RequestRejected:
    """INVALID_ARGUMENT naming the field and the rule, e.g. ``invalid("sampling.top_p: ...")``."""
    return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, message, ErrorCode.INVALID_ARGUMENT)


def unsupported(message: str) -> RequestRejected:
    """An explicit option the model does not advertise: INVALID_ARGUMENT, never ignored."""
    return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, message, ErrorCode.UNSUPPORTED_FEATURE)


def model_not_found(model: str) -> RequestRejected:
    return RequestRejected(
        grpc.StatusCode.NOT_FOUND, f"model: unknown model {model!r}", ErrorCode.MODEL_NOT_FOUND
    )


def not_found(message: str, code: ErrorCode = ErrorCode.REQUEST_NOT_FOUND) -> RequestRejected:
    return RequestRejected(grpc.StatusCode.NOT_FOUND, message, code)


def role_mismatch(message: str) -> RequestRejected:
    return RequestRejected(grpc.StatusCode.FAILED_PRECONDITION, message, ErrorCode.ROLE_MISMATCH)


# The refusals engine adapters raise: they name an error code and a situation, never a gRPC status
# (engine packages do not import grpc; the status is derived here, in one place).


def rejected(code: ErrorCode, message: str, *, retry_after_ms: int | None = None) -> RequestRejected:
    """A refusal whose status is the one ``code`` maps to (``STATUS_FOR_CODE``)."""
    return RequestRejected(STATUS_FOR_CODE[code], message, code, retry_after_ms=retry_after_ms)


def engine_refused(message: str) -> RequestRejected:
    """The engine would not take a well-formed request (it is stopping, its queue broke):
    UNAVAILABLE, so a client may retry elsewhere."""
    return RequestRejected(grpc.StatusCode.UNAVAILABLE, message, ErrorCode.INTERNAL)


def precondition(message: str, *, retry_after_ms: int | None = None) -> RequestRejected:
    """Valid, but not in the engine's present state (an adapter in use, an engine-side refusal
    of a control call): FAILED_PRECONDITION, retryable when ``retry_after_ms`` is given."""
    return RequestRejected(grpc.StatusCode.FAILED_PRECONDITION, message, ErrorCode.INVALID_ARGUMENT,
                           retry_after_ms=retry_after_ms)


def _auth_error(status: grpc.StatusCode, message: str) -> RequestRejected:
    reason = "unauthenticated" if status == grpc.StatusCode.UNAUTHENTICATED else "permission_denied"
    return RequestRejected(status, message, ErrorCode.UNSPECIFIED, details={"auth": reason})


def unauthenticated(message: str) -> RequestRejected:
    """No credentials, or wrong ones (the security interceptor)."""
    return _auth_error(grpc.StatusCode.UNAUTHENTICATED, message)


def permission_denied(message: str) -> RequestRejected:
    """A known caller (or peer) that may not do this (operator RPCs, LoadLora from the network)."""
    return _auth_error(grpc.StatusCode.PERMISSION_DENIED, message)


class EngineFailure(Exception):
    """Failed after acceptance: exactly one terminal ``EngineError`` reports it."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool = False,
        retry_after_ms: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        message = bounded(message)
        super().__init__(message)
        if retry_after_ms is not None and not retryable:
            raise ValueError("retry_after_ms is only valid for retryable errors")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        self.details = details or {}


def refusal(exc: BaseException, context: str = "engine error") -> RequestRejected:
    """Any backend error where a call ends with a status (before acceptance, a unary RPC, an
    event stream that could not start): a refusal as is, an engine failure with the status its
    code maps to, anything else (a backend bug) INTERNAL with ``context``. The one mapping."""
    if isinstance(exc, RequestRejected):
        return exc
    if isinstance(exc, EngineFailure):
        return RequestRejected(STATUS_FOR_CODE[exc.code], exc.message, exc.code,
                               retry_after_ms=exc.retry_after_ms, details=exc.details)
    return RequestRejected(grpc.StatusCode.INTERNAL, f"{context}: {exc}", ErrorCode.INTERNAL)
