"""Client-chosen request ids: bounded, since the server keeps them (live table, finished-id memory,
the engine's own bookkeeping) and echoes them in errors."""

from __future__ import annotations

from openengine_adapters.errors import invalid

MAX_REQUEST_ID_BYTES = 256  # README "Security"; a UUID with a prefix fits many times over


def check_request_id(request_id: str, field: str) -> None:
    size = len(request_id.encode("utf-8"))
    if size > MAX_REQUEST_ID_BYTES:
        raise invalid(f"{field}: {size} bytes; request ids are at most {MAX_REQUEST_ID_BYTES} bytes (UTF-8)")
