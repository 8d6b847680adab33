"""KvSessionRef checks done before acceptance, so an engine never blocks on an unusable handoff."""

from __future__ import annotations

from typing import Any

from openengine_adapters.backend import KvEndpoint, KvSession
from openengine_adapters.errors import invalid
from openengine_adapters.v1 import kv_pb2
from openengine_adapters.validation.extra import request_struct

WILDCARD_HOSTS = frozenset({"", "*", "0.0.0.0", "::", "[::]"})


def parse_kv_session(ref: kv_pb2.KvSessionRef, field: str, transfer_backend: str = "") -> KvSession:
    """Validate a session reference; ``transfer_backend`` is the engine's, when it has one."""
    if not ref.session_id:
        raise invalid(f"{field}.session_id: must be non-empty")
    if transfer_backend and ref.transfer_backend and ref.transfer_backend != transfer_backend:
        raise invalid(
            f"{field}.transfer_backend: {ref.transfer_backend!r} does not match this engine's "
            f"transfer backend {transfer_backend!r}"
        )
    endpoints = []
    for i, ep in enumerate(ref.endpoints):
        if ep.host in WILDCARD_HOSTS:
            raise invalid(f"{field}.endpoints[{i}].host: must be a routable host, not {ep.host!r}")
        if not 0 < ep.port < 65536:
            raise invalid(f"{field}.endpoints[{i}].port: must be in 1..65535")
        endpoints.append(KvEndpoint(ep.host, ep.port, ep.protocol))
    attributes = (
        request_struct(ref.attributes_struct, f"{field}.attributes_struct") if ref.HasField("attributes_struct") else {}
    )
    return KvSession(
        session_id=ref.session_id,
        transfer_backend=ref.transfer_backend,
        endpoints=tuple(endpoints),
        dp_rank=ref.dp_rank,
        attributes=attributes,
    )


def struct_int(value: Any, name: str) -> int:
    """An integer from a Struct value: numbers arrive as doubles; big ids may be decimal strings."""
    if isinstance(value, bool):
        raise invalid(f"kv.session.attributes_struct.{name}: must be an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise invalid(f"kv.session.attributes_struct.{name}: must be an integer, got {value!r}")


def restore_struct_ints(value: Any) -> Any:
    """A Struct value with its integral doubles given back as ints (ports, block ids, sizes), at
    any depth: engine handoffs read them as ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [restore_struct_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: restore_struct_ints(v) for k, v in value.items()}
    return value
