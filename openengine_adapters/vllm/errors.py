"""vLLM's exceptions as the contract's errors: a refusal before acceptance, a failure after."""

from __future__ import annotations

from openengine_adapters.errors import EngineFailure, RequestRejected, invalid, rejected
from openengine_adapters.types import ErrorCode


def client_error(exc: Exception) -> RequestRejected:
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    if isinstance(exc, QueueOverflowError | MaxQueuedTokensError):
        return rejected(ErrorCode.OVERLOADED, f"engine queue is full: {exc}", retry_after_ms=100)
    parameter = getattr(exc, "parameter", None)
    if parameter in ("image", "video", "audio", "multi_modal_data"):  # vLLM names media by modality
        parameter = "media"
    return invalid(f"{parameter or 'request'}: rejected by vLLM: {exc}")


def engine_failure(exc: BaseException) -> EngineFailure:
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, EngineDeadError):
        # the request did not complete and belongs on another engine, at once: the same terminal
        # error as the watchdog's (core.watchdog.engine_failure), whichever sees the death first
        return EngineFailure(ErrorCode.INTERNAL, "the engine died: the vLLM engine core died", retryable=True,
                             retry_after_ms=0)
    return EngineFailure(ErrorCode.INTERNAL, f"vLLM error: {type(exc).__name__}: {exc}")
