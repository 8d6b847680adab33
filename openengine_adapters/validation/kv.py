"""KvSessionRef checks done before acceptance, so an engine never blocks on an unusable handoff."""

from __future__ import annotations

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
