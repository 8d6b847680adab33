"""Disaggregated prefill/decode on TensorRT-LLM: its ``DisaggregatedParams`` <-> ``KvSessionRef``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.sessions import struct_int
from openengine_adapters.errors import invalid

# A handoff is laid out as TensorRT-LLM's own OpenEngine server lays it out
# (tensorrt_llm/grpc/openengine/disagg.py prefill_ready_response / disaggregated_params_from_request),
# so either side can consume the other's: KvSessionRef.session_id = str(ctx_request_id),
# dp_rank = ctx_dp_rank, and in attributes_struct opaque_state (base64), first_gen_tokens,
# draft_tokens, and where the engine's DisaggregatedParams has them disagg_request_id (a string),
# ctx_dp_rank and ctx_info_endpoint.
OPTIONAL_DISAGG_FIELDS = ("disagg_request_id", "ctx_dp_rank", "ctx_info_endpoint")


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list | tuple):
        raise invalid(f"kv.session.attributes_struct.{name}: must be a list of token ids, got {value!r}")
    out = [struct_int(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if any(v < 0 for v in out):
        raise invalid(f"kv.session.attributes_struct.{name}: token ids must be >= 0")
    return out


def _ctx_request_id(session: be.KvSession) -> int:
    attrs = session.attributes
    if "ctx_request_id" in attrs:  # sessions of this adapter before the shared layout
        return struct_int(attrs["ctx_request_id"], "ctx_request_id")
    try:
        return int(session.session_id)
    except ValueError:
        raise invalid("kv.session.session_id: must be the integer context request id of a TensorRT-LLM "
                      f"prefill, got {session.session_id!r}") from None


def decode_disaggregated(session: be.KvSession, engine_fields: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A TensorRT-LLM prefill's KvSessionRef -> ``DisaggregatedParams`` kwargs for a
    ``generation_only`` request. Raises ``RequestRejected`` naming the bad attribute.

    ``engine_fields``: the fields of the engine's ``DisaggregatedParams``. ``opaque_state`` is
    required unless the engine takes ``ctx_info_endpoint`` and the session has one: one of them
    locates the context worker, and the engine consumes a handoff on its executor loop with no
    timeout, so a session it cannot resolve would stall every request on the engine
    (``tensorrt_llm/grpc/openengine/disagg.py`` ``_validate_kv_session`` refuses it for that reason).
    """
    attrs = session.attributes
    if "first_gen_tokens" not in attrs:
        raise invalid("kv.session.attributes_struct.first_gen_tokens: required for a TensorRT-LLM "
                      "decode (the PrefillReady session attributes)")
    kw: dict[str, Any] = {
        "request_type": "generation_only",
        "ctx_request_id": _ctx_request_id(session),
        "first_gen_tokens": _int_list(attrs["first_gen_tokens"], "first_gen_tokens"),
    }
    if not kw["first_gen_tokens"]:
        raise invalid("kv.session.attributes_struct.first_gen_tokens: must not be empty")
    state = attrs.get("opaque_state")
    if isinstance(state, str) and state:
        try:
            kw["opaque_state"] = base64.b64decode(state, validate=True)
        except (binascii.Error, ValueError):
            raise invalid("kv.session.attributes_struct.opaque_state: must be base64") from None
    elif state not in (None, ""):
        raise invalid(f"kv.session.attributes_struct.opaque_state: must be a base64 string, got "
                      f"{type(state).__name__}")
    endpoint = attrs.get("ctx_info_endpoint")
    if endpoint is not None:
        if "ctx_info_endpoint" not in engine_fields:
            raise invalid("kv.session.attributes_struct.ctx_info_endpoint: this TensorRT-LLM version cannot "
                          "locate a context worker by endpoint; the session needs opaque_state")
        if not isinstance(endpoint, str) or not endpoint:
            raise invalid("kv.session.attributes_struct.ctx_info_endpoint: must be a non-empty string")
        kw["ctx_info_endpoint"] = endpoint
    if not kw.get("opaque_state") and "ctx_info_endpoint" not in kw:
        raise invalid("kv.session.attributes_struct.opaque_state: required (it is what locates the context "
                      "worker; TensorRT-LLM would wait for a handoff it cannot resolve and stall the engine)")
    draft = attrs.get("draft_tokens")
    if draft is not None:
        kw["draft_tokens"] = _int_list(draft, "draft_tokens")
    for name in ("disagg_request_id", "ctx_dp_rank"):
        value = attrs.get(name)
        if value is None:
            continue
        if name not in engine_fields:
            raise invalid(f"kv.session.attributes_struct.{name}: this TensorRT-LLM version has no {name}; "
                          "the handoff cannot be resumed here")
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise invalid(f"kv.session.attributes_struct.{name}: must be an integer") from None
        kw[name] = struct_int(value, name)
    if "ctx_dp_rank" not in kw and session.dp_rank and "ctx_dp_rank" in engine_fields:
        kw["ctx_dp_rank"] = session.dp_rank
    return kw


def session_key(dp: Any) -> str:
    """The handoff a decode consumes: the context request and what locates its worker."""
    state = getattr(dp, "opaque_state", None)
    where = base64.b64encode(bytes(state)).decode("ascii") if state else getattr(dp, "ctx_info_endpoint", "")
    return f"{dp.ctx_request_id}@{where}"


def encode_disaggregated(dp: Any, fallback_id: str = "") -> tuple[str, int, dict[str, Any]]:
    """A prefill result's ``DisaggregatedParams`` -> (session_id, dp_rank, JSON-like attributes),
    in the layout above."""
    ctx = dp.ctx_request_id
    attrs: dict[str, Any] = {"first_gen_tokens": list(dp.first_gen_tokens or ())}
    if dp.opaque_state is not None:
        attrs["opaque_state"] = base64.b64encode(bytes(dp.opaque_state)).decode("ascii")
    if dp.draft_tokens:
        attrs["draft_tokens"] = list(dp.draft_tokens)
    for name in OPTIONAL_DISAGG_FIELDS:
        value = getattr(dp, name, None)
        if value is not None:
            attrs[name] = str(value) if name == "disagg_request_id" else value
    return ("" if ctx is None else str(ctx)) or fallback_id, int(getattr(dp, "ctx_dp_rank", None) or 0), attrs

