"""The v0.1.0 gRPC request metadata keys (routing, admission, tracing), parsed and checked.

Upstream: clients send at most one value per ``openengine-`` key; a malformed numeric value or a
repeated ``openengine-`` key is INVALID_ARGUMENT, before acceptance. Routing and admission keys
apply to Inference RPCs only. Trace Context follows W3C: a malformed or repeated ``traceparent``
is ignored (the trace restarts), never an error, and ``tracestate`` travels only with a valid
``traceparent``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from openengine_adapters.errors import invalid

PRIORITY = "openengine-priority"
TARGET_DP_RANK = "openengine-target-dp-rank"
ROUTING_KEY = "openengine-routing-key"
RESERVED_PREFIX = "openengine-"
TRACEPARENT, TRACESTATE = "traceparent", "tracestate"

_INT = re.compile(r"-?[0-9]+")
_UINT = re.compile(r"[0-9]+")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ROUTING_KEY = re.compile(r"[\x20-\x7e]+")
# transport and credential headers never become request metadata seen by an engine
_NOT_FORWARDED = frozenset({"authorization", "proxy-authorization", "cookie", "user-agent", "te",
                            "content-type", "x-api-key"})


@dataclass(frozen=True)
class InferenceMetadata:
    priority: int | None = None
    target_dp_rank: int | None = None
    routing_key: str | None = None
    trace_headers: dict[str, str] = field(default_factory=dict)
    # application keys (not reserved, not transport): forwarded as the request's metadata
    application: dict[str, str] = field(default_factory=dict)


def _number(key: str, value: str, pattern: re.Pattern, low: int, high: int, kind: str) -> int:
    if not pattern.fullmatch(value):
        raise invalid(f"{key}: {value[:64]!r} is not a base-10 {kind}")
    # a value of thousands of digits is out of range: never converted (Python refuses past 4300 digits)
    number = int(value) if len(value) <= 40 else None
    if number is None or not low <= number <= high:
        shown = value if len(value) <= 64 else f"{value[:64]}... ({len(value)} digits)"
        raise invalid(f"{key}: {shown} is out of the {kind} range [{low}, {high}]")
    return number


def valid_traceparent(value: str) -> bool:
    m = _TRACEPARENT.fullmatch(value)
    if m is None or m.group(1) == "ff":
        return False
    if m.group(1) == "00" and m.group(5):
        return False  # version 00 has exactly four fields
    return m.group(2) != "0" * 32 and m.group(3) != "0" * 16


def trace_context(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """``traceparent``/``tracestate`` when the parent is valid and sent once (W3C), else empty."""
    parents = [v for k, v in metadata if k == TRACEPARENT]
    if len(parents) != 1 or not isinstance(parents[0], str) or not valid_traceparent(parents[0]):
        return {}
    out = {TRACEPARENT: parents[0]}
    states = [v for k, v in metadata if k == TRACESTATE and isinstance(v, str)]
    if states:
        out[TRACESTATE] = ",".join(states)  # W3C: repeated tracestate headers are one list
    return out


def parse_inference(metadata: Iterable[tuple[str, str | bytes]] | None) -> InferenceMetadata:
    """The Inference RPC's routing, admission and trace keys; INVALID_ARGUMENT naming the key."""
    items = list(metadata or ())
    seen: set[str] = set()
    values: dict[str, str] = {}
    application: dict[str, str] = {}
    for key, value in items:
        if key.startswith(RESERVED_PREFIX):
            if key in seen:
                raise invalid(f"{key}: sent more than once (an OpenEngine metadata key takes one value)")
            seen.add(key)
            if isinstance(value, str):
                values[key] = value
        elif (isinstance(value, str) and not key.startswith((":", "grpc-")) and key not in _NOT_FORWARDED
              and key not in (TRACEPARENT, TRACESTATE)):
            application[key] = value
    priority = target = routing = None
    if PRIORITY in values:
        priority = _number(PRIORITY, values[PRIORITY], _INT, -(2**31), 2**31 - 1, "int32")
    if TARGET_DP_RANK in values:
        target = _number(TARGET_DP_RANK, values[TARGET_DP_RANK], _UINT, 0, 2**32 - 1, "uint32")
    if ROUTING_KEY in values:
        routing = values[ROUTING_KEY]
        if not _ROUTING_KEY.fullmatch(routing):
            raise invalid(f"{ROUTING_KEY}: must be a non-empty printable ASCII string")
        application[ROUTING_KEY] = routing
    return InferenceMetadata(priority, target, routing, trace_context(items), application)
