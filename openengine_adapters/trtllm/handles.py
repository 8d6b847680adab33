"""One request's ``RequestOutput`` handle: its updates with engine errors as EngineFailure, its
abort, and TensorRT-LLM's per-request error told apart from an engine failure."""

from __future__ import annotations

import asyncio
import logging

from openengine_adapters.errors import EngineFailure, RequestRejected
from openengine_adapters.types import ErrorCode

log = logging.getLogger(__name__)


async def iterate(handle):
    """A RequestOutput's updates, engine errors as EngineFailure."""
    it = handle.__aiter__()
    while True:
        try:
            out = await it.__anext__()
        except StopAsyncIteration:
            return
        except (asyncio.CancelledError, EngineFailure, RequestRejected):
            raise
        except Exception as exc:
            raise EngineFailure(ErrorCode.INTERNAL, f"TensorRT-LLM error: {type(exc).__name__}: {exc}") from None
        yield out


def is_request_error(exc: BaseException) -> bool:
    """TensorRT-LLM's per-request error (``executor/utils.py`` ``RequestError``), by class name:
    importing it would import the engine."""
    return any(c.__name__ == "RequestError" for c in type(exc).__mro__)


def abort_handle(handle) -> None:
    try:
        handle.abort()
    except Exception:  # already finished / executor gone: nothing left to stop
        log.debug("abort of a TensorRT-LLM request failed", exc_info=True)
