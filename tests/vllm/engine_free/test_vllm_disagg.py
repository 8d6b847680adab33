"""The vLLM adapter's KV-session rules (pure; the real handoff is in tests/vllm/test_disagg.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import grpc
import pytest

from openengine_adapters.backend import KvSession
from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import EngineRole, ErrorCode
from openengine_adapters.vllm import disagg


def kv_config(connector="NixlConnector", role="kv_producer", extra=None):
    return SimpleNamespace(kv_connector=connector, kv_role=role, kv_connector_extra_config=extra or {})


NIXL = disagg.Connector.from_config(kv_config(extra={"kv_lease_duration": 5}))
HANDOFF = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2, 3]],
           "remote_engine_id": "e1", "remote_request_id": "r1-abc", "remote_host": "10.0.0.1",
           "remote_port": 5600, "remote_num_tokens": 295}


def as_struct(value):
    """What crosses attributes_struct: every number becomes a double."""
    if isinstance(value, bool) or not isinstance(value, int | dict | list):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, list):
        return [as_struct(v) for v in value]
    return {k: as_struct(v) for k, v in value.items()}


def test_roles_need_a_matching_connector():
    assert disagg.role_problem(EngineRole.AGGREGATED, None) is None
    assert "needs a KV connector" in disagg.role_problem(EngineRole.PREFILL, None)
    assert "kv_producer or kv_both" in disagg.role_problem(EngineRole.PREFILL, kv_config(role="kv_consumer"))
    assert disagg.role_problem(EngineRole.DECODE, kv_config(role="kv_both")) is None
    assert disagg.default_role(kv_config(role="kv_consumer")) == EngineRole.DECODE
    assert disagg.default_role(kv_config(role="kv_both")) == EngineRole.AGGREGATED
    assert disagg.transfer_backend_name("NixlConnector") == "nixl"


def test_session_round_trip_restores_integer_types():
    prompt = list(range(295))
    session = NIXL.session("req-1", HANDOFF, prompt, dp_rank=0)
    assert session.endpoints[0].host == "10.0.0.1" and session.endpoints[0].port == 5600
    assert session.attributes["prompt_tokens"] == 295
    received = KvSession(session.session_id, "nixl", session.endpoints, 0, as_struct(dict(session.attributes)))
    handoff = NIXL.decode_handoff(received)
    assert handoff.kv_transfer_params == HANDOFF
    assert isinstance(handoff.kv_transfer_params["remote_port"], int)
    assert handoff.key == "e1/r1-abc"
    handoff.check_prompt(prompt)


@pytest.mark.parametrize("change, fragment", [
    ({"remote_port": "x"}, "kv_transfer_params.remote_port: missing or not a int"),
    ({"remote_engine_id": None}, "kv_transfer_params.remote_engine_id"),
    ({"do_remote_prefill": False}, "do_remote_prefill: must be true"),
])
def test_malformed_handoffs_are_invalid(change, fragment):
    attrs = dict(NIXL.session("s", HANDOFF, [1, 2], 0).attributes)
    attrs["kv_transfer_params"] = {**HANDOFF, **change}
    with pytest.raises(RequestRejected) as err:
        NIXL.decode_handoff(KvSession("s", attributes=attrs))
    assert err.value.status == grpc.StatusCode.INVALID_ARGUMENT and fragment in str(err.value)


def test_missing_params_and_expiry():
    with pytest.raises(RequestRejected, match="kv_transfer_params: required"):
        NIXL.decode_handoff(KvSession("s"))
    attrs = {"kv_transfer_params": HANDOFF, "expires_unix_ms": int(time.time() * 1000) - 1}
    with pytest.raises(RequestRejected) as err:
        NIXL.decode_handoff(KvSession("s", attributes=attrs))
    assert err.value.status == grpc.StatusCode.NOT_FOUND and err.value.code == ErrorCode.KV_SESSION_NOT_FOUND


def test_prompt_must_match_the_prefilled_one():
    handoff = NIXL.decode_handoff(KvSession("s", attributes=NIXL.session("s", HANDOFF, [1, 2, 3], 0).attributes))
    with pytest.raises(RequestRejected, match="2 prompt tokens, but the KV session holds KV for 3"):
        handoff.check_prompt([1, 2])
    with pytest.raises(RequestRejected, match="prompt_digest"):
        handoff.check_prompt([1, 2, 4])


def test_connector_info_is_truthful_per_role():
    info = NIXL.info(EngineRole.DECODE, 14)
    assert info.transfer_backend == "nixl" and info.supports_remote_prefill and info.supports_decode_pull
    assert info.supports_abort_cleanup is False and info.schema_version == 14
    assert not NIXL.info(EngineRole.PREFILL, 14).supports_remote_prefill
