"""Disaggregated prefill/decode on SGLang: the bootstrap rendezvous a PREFILL request is given and a
DECODE request joins, carried in ``KvSessionRef.attributes_struct`` (``SESSION_KEYS``), and
``SglangDisagg``, the mixin of ``SglangBackend`` that hands sessions off and releases them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.sessions import seal, struct_int
from openengine_adapters.errors import EngineFailure, invalid
from openengine_adapters.types import EngineRole, ErrorCode

# The KvSessionRef.attributes_struct keys of an SGLang PD handoff (the bootstrap rendezvous).
SESSION_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room", "prefill_dp_rank")

# SGLang's FAKE_BOOTSTRAP_HOST (disaggregation/utils.py): no peer, no transfer (warmup, health).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


_MAX_SAFE_INT = 2**53

_ROOM_LIMIT = 2**63  # SGLang keeps bootstrap rooms in int64 tensors

def new_bootstrap_room() -> int:
    """A random bootstrap room (SGLang's router picks them the same way: 63 random bits)."""
    return uuid.uuid4().int & (_ROOM_LIMIT - 1)


def encode_session(host: str, port: int, room: int, prefill_dp_rank: int) -> dict[str, Any]:
    """KvSessionRef.attributes_struct of an SGLang handoff. Struct numbers are doubles, so a room
    above 2^53 travels as a decimal string."""
    return {"bootstrap_host": host, "bootstrap_port": port,
            "bootstrap_room": room if room < _MAX_SAFE_INT else str(room), "prefill_dp_rank": prefill_dp_rank}


def decode_session(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """KvSessionRef.attributes_struct -> the ``GenerateReqInput`` bootstrap fields of a decode
    request (the same rendezvous the prefill request used). Raises ``RequestRejected`` naming the
    bad attribute."""
    for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
        if key not in attributes:
            raise invalid(f"kv.session.attributes_struct.{key}: required for an SGLang decode "
                          "(the PrefillReady session attributes)")
    host = attributes["bootstrap_host"]
    if not isinstance(host, str) or not host:
        raise invalid("kv.session.attributes_struct.bootstrap_host: must be a non-empty string")
    port = struct_int(attributes["bootstrap_port"], "bootstrap_port")
    if not 0 < port < 65536:
        raise invalid(f"kv.session.attributes_struct.bootstrap_port: {port} is not a port")
    room = struct_int(attributes["bootstrap_room"], "bootstrap_room")
    if not 0 <= room < _ROOM_LIMIT:
        raise invalid("kv.session.attributes_struct.bootstrap_room: must be in [0, 2^63)")
    kw = {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
    if attributes.get("prefill_dp_rank") is not None:
        rank = struct_int(attributes["prefill_dp_rank"], "prefill_dp_rank")
        if rank < 0:
            raise invalid("kv.session.attributes_struct.prefill_dp_rank: must be >= 0")
        kw["disagg_prefill_dp_rank"] = rank
    return kw


def session_key(disagg: Mapping[str, Any]) -> str:
    """The handoff a decode consumes: its bootstrap rendezvous (host, port, room)."""
    return f"{disagg['bootstrap_host']}:{disagg['bootstrap_port']}/{disagg['bootstrap_room']}"


BOOTSTRAP_PROTOCOL = "sglang-bootstrap"


class SglangDisagg:
    """The prefill/decode side of ``SglangBackend``: its connector, rendezvous and handed-off sessions."""

    def kv_connector(self) -> be.KvConnector | None:
        if self.role == EngineRole.AGGREGATED:
            return None
        endpoints = (be.KvEndpoint(self.host, self.bootstrap_port, BOOTSTRAP_PROTOCOL),) \
            if self.role == EngineRole.PREFILL else ()
        return be.KvConnector(enabled=True, transfer_backend=self.transfer_backend, local_endpoints=endpoints,
                              supported_protocols=(BOOTSTRAP_PROTOCOL,),
                              supports_remote_prefill=self.role == EngineRole.DECODE,
                              supports_decode_pull=self.role == EngineRole.DECODE,
                              supports_abort_cleanup=True, supports_drain=True)

    def _rendezvous(self, params: be.GenerateParams) -> tuple[dict[str, Any] | None, be.KvSession | None]:
        """A PREFILL request's new bootstrap room and the session it hands off; a DECODE request's
        rendezvous from its session; (None, None) otherwise."""
        if self.role == EngineRole.PREFILL:
            room = new_bootstrap_room()
            rank = params.data_parallel_rank or 0
            session = be.KvSession(
                session_id=params.request_id, transfer_backend=self.transfer_backend,
                endpoints=(be.KvEndpoint(self.host, self.bootstrap_port, BOOTSTRAP_PROTOCOL),), dp_rank=rank,
                attributes={**encode_session(self.host, self.bootstrap_port, room, rank),
                            **seal(params.prompt, params.token_ids)})
            return {"bootstrap_host": self.host, "bootstrap_port": self.bootstrap_port, "bootstrap_room": room}, session
        if self.role == EngineRole.DECODE and params.kv_session is not None:
            return decode_session(params.kv_session.attributes), None
        return None, None

    def _handoff(self, params: be.GenerateParams, session: be.KvSession | None, rids: list[str]) -> be.KvSession:
        if session is None:
            raise EngineFailure(ErrorCode.INTERNAL, "prefill finished without a bootstrap session")
        self.sessions.hand_off(session.session_id, rids)
        return session

    async def release_kv_session(self, session: be.KvSession) -> bool:
        """Prefill side: SGLang frees the request's KV once the decode side took it; aborting its
        rid stops a transfer still waiting for the decode peer."""
        held, rids = self.sessions.release(session.session_id)
        if not held:
            return False
        for rid in rids:
            self._abort_rid(rid)
        return True

    def open_kv_sessions(self) -> int | None:
        return self.sessions.held() if self.role == EngineRole.PREFILL else None
