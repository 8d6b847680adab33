"""The trace headers the engine is handed: our RPC span's when tracing is on, else the caller's.

The tracing interceptor (``openengine_adapters.tracing``, a serving concern) sets ``RPC_TRACE_HEADERS``
for the RPC it wraps; the core reads it once per Generate at acceptance. Kept here so the core depends
on no serving module.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping

# the W3C headers of the current RPC's span: what the engine is handed instead of the caller's
RPC_TRACE_HEADERS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "openengine_rpc_trace_headers", default=None)


def engine_trace_headers(caller: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """Our RPC span's trace headers when tracing is on, else the caller's."""
    return RPC_TRACE_HEADERS.get() or caller
