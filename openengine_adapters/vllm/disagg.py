"""Disaggregated prefill/decode on vLLM's KV connectors (NixlConnector first).

A PREFILL engine runs the prompt with ``do_remote_decode`` and hands back the connector's
``kv_transfer_params``; a DECODE engine passes them back so vLLM pulls the blocks. Our
``KvSessionRef.attributes_struct`` carries::

    {"kv_transfer_params": {...vLLM's handoff, types restored on decode...},
     "prompt_tokens": 295,                 # the prompt the KV belongs to
     "prompt_digest": "blake2b-128:...",   # so a decode of another prompt is refused
     "expires_unix_ms": 1764...}           # when the prefill side frees the blocks

vLLM itself does not check that the decode prompt is the one the KV was computed for, and
reading freed blocks silently gives garbage; the digest, the expiry and the decode side's
memory of consumed sessions turn both into a status before acceptance.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.sessions import DIGEST_KEY, TOKENS_KEY, check_seal, restore_struct_ints, seal
from openengine_adapters.errors import invalid, not_found
from openengine_adapters.types import EngineRole, ErrorCode

# kv_role values that can serve each OpenEngine role
ROLE_KV_ROLES = {
    EngineRole.PREFILL: ("kv_producer", "kv_both"),
    EngineRole.DECODE: ("kv_consumer", "kv_both"),
}
DEFAULT_ROLE = {"kv_producer": EngineRole.PREFILL, "kv_consumer": EngineRole.DECODE}
# keys every NIXL handoff must carry, with the type vLLM reads them as
NIXL_REQUIRED = {"remote_engine_id": str, "remote_request_id": str, "remote_host": str,
                 "remote_port": int, "remote_block_ids": list}
NIXL_LEASE_S = 30  # vLLM's default kv_lease_duration (kv_connector_extra_config)


def transfer_backend_name(connector: str) -> str:
    """``NixlConnector`` -> ``nixl``: the name a KvSessionRef and KvConnectorInfo carry."""
    name = connector.removesuffix("Connector")
    return name.lower() or connector.lower()


def role_problem(role: EngineRole, kv_transfer_config) -> str | None:
    """Why this engine cannot serve ``role`` (None when it can)."""
    if role not in ROLE_KV_ROLES:
        return None
    if kv_transfer_config is None or not kv_transfer_config.kv_connector:
        return (f"role {role.name} needs a KV connector: pass --kv-transfer-config "
                f"'{{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"{ROLE_KV_ROLES[role][0]}\"}}'")
    if kv_transfer_config.kv_role not in ROLE_KV_ROLES[role]:
        return (f"role {role.name} needs kv_role {' or '.join(ROLE_KV_ROLES[role])}, "
                f"the engine has {kv_transfer_config.kv_role!r}")
    return None


def default_role(kv_transfer_config) -> EngineRole:
    """The role a connector's kv_role implies (kv_both and no connector: AGGREGATED)."""
    if kv_transfer_config is None or not kv_transfer_config.kv_connector:
        return EngineRole.AGGREGATED
    return DEFAULT_ROLE.get(kv_transfer_config.kv_role, EngineRole.AGGREGATED)


@dataclass(frozen=True)
class Connector:
    """What a configured vLLM KV connector means for sessions."""

    name: str                 # vLLM's connector class name
    transfer_backend: str     # nixl, example, ...
    kv_role: str
    lease_s: float
    side_channel: be.KvEndpoint | None

    @classmethod
    def from_config(cls, cfg) -> Connector | None:
        if cfg is None or not cfg.kv_connector:
            return None
        extra = cfg.kv_connector_extra_config or {}
        side = None
        if cfg.kv_connector == "NixlConnector":
            side = be.KvEndpoint(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
                                 int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")), "nixl")
        return cls(cfg.kv_connector, transfer_backend_name(cfg.kv_connector), cfg.kv_role,
                   float(extra.get("kv_lease_duration", NIXL_LEASE_S)), side)

    @property
    def requires_params(self) -> bool:
        """NIXL pulls by the params; shared-storage connectors find KV by prompt alone."""
        return self.name == "NixlConnector"

    def info(self, role: EngineRole, schema_version: int | None) -> be.KvConnector:
        return be.KvConnector(
            enabled=True,
            transfer_backend=self.transfer_backend,
            local_endpoints=(self.side_channel,) if self.side_channel else (),
            supported_protocols=(self.transfer_backend,),
            supports_remote_prefill=role == EngineRole.DECODE,
            supports_decode_pull=role == EngineRole.DECODE and self.requires_params,
            # a handed-off session's blocks are freed by vLLM at lease expiry, not on request
            supports_abort_cleanup=False,
            supports_drain=True,
            schema_version=schema_version,
        )

    # ------------------------------------------------------------------ prefill side

    def prefill_transfer_params(self) -> dict[str, Any]:
        """What asks vLLM's connector to keep a prefill's KV for a remote decode."""
        return {"do_remote_decode": True, "do_remote_prefill": False}

    def session(self, session_id: str, kv_transfer_params: Mapping[str, Any] | None,
                prompt_token_ids: Sequence[int], dp_rank: int) -> be.KvSession:
        """The KvSessionRef for a finished prefill."""
        params = dict(kv_transfer_params or {})
        if self.requires_params and not params:
            raise ValueError(f"{self.name} finished the prefill without kv_transfer_params")
        endpoints = ()
        if "remote_host" in params and "remote_port" in params:
            endpoints = (be.KvEndpoint(str(params["remote_host"]), int(params["remote_port"]),
                                       self.transfer_backend),)
        attributes: dict[str, Any] = {
            **seal(None, prompt_token_ids),
            "expires_unix_ms": int((time.time() + self.lease_s) * 1000),
        }
        if params:
            attributes["kv_transfer_params"] = params
        return be.KvSession(session_id=session_id, transfer_backend=self.transfer_backend,
                            endpoints=endpoints, dp_rank=dp_rank, attributes=attributes)

    # ------------------------------------------------------------------ decode side

    def decode_handoff(self, session: be.KvSession) -> Handoff:
        """Check a session's attributes before acceptance; the handoff to give vLLM."""
        field = "kv.session.attributes_struct"
        attrs = session.attributes
        raw = attrs.get("kv_transfer_params")
        params = restore_struct_ints(dict(raw)) if isinstance(raw, Mapping) else None
        if raw is not None and params is None:
            raise invalid(f"{field}.kv_transfer_params: must be an object")
        if self.requires_params:
            if params is None:
                raise invalid(f"{field}.kv_transfer_params: required by {self.name} (the prefill "
                              "engine's handoff)")
            for key, typ in NIXL_REQUIRED.items():
                if not isinstance(params.get(key), typ):
                    raise invalid(f"{field}.kv_transfer_params.{key}: missing or not a {typ.__name__}")
            if not params.get("do_remote_prefill"):
                raise invalid(f"{field}.kv_transfer_params.do_remote_prefill: must be true (a handoff "
                              "from a prefill engine)")
        tokens = restore_struct_ints(attrs.get("prompt_tokens"))
        if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
            raise invalid(f"{field}.prompt_tokens: must be a positive integer")
        digest = attrs.get("prompt_digest")
        if digest is not None and not isinstance(digest, str):
            raise invalid(f"{field}.prompt_digest: must be a string")
        expires = restore_struct_ints(attrs.get("expires_unix_ms"))
        if expires is not None:
            if not isinstance(expires, int):
                raise invalid(f"{field}.expires_unix_ms: must be an integer")
            if expires <= time.time() * 1000:
                raise not_found(f"kv.session: session {session.session_id!r} expired (the prefill "
                                "engine freed its KV)", ErrorCode.KV_SESSION_NOT_FOUND)
        key = None
        if params is not None and "remote_engine_id" in params:
            key = f"{params['remote_engine_id']}/{params['remote_request_id']}"
        return Handoff(params, tokens, digest, key)


@dataclass(frozen=True)
class Handoff:
    kv_transfer_params: dict[str, Any] | None
    prompt_tokens: int | None
    digest: str | None
    key: str | None  # identifies the prefill's KV across decode requests

    def check_prompt(self, token_ids: Sequence[int]) -> None:
        """The decode prompt must be the one the KV was computed for."""
        check_seal({TOKENS_KEY: self.prompt_tokens, DIGEST_KEY: self.digest}, None, token_ids)
