"""The shared engine kit (openengine_adapters/engine_kit): pure pieces every adapter uses."""

from __future__ import annotations

import pytest

from openengine_adapters.engine_kit.sessions import SessionTable, check_seal, prompt_digest, seal, text_digest
from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import ErrorCode


def test_session_table_tracks_both_sides():
    table = SessionTable(capacity=2)
    table.hand_off("a", lease_s=60)
    table.hand_off("b", lease_s=0)  # already expired
    assert table.held() == 1
    assert table.forget("a") and not table.forget("a") and table.held() == 0
    table.consume("k")
    with pytest.raises(RequestRejected) as err:
        table.consume("k")
    assert err.value.code == ErrorCode.KV_SESSION_NOT_FOUND and err.value.status.name == "NOT_FOUND"
    table.unconsume("k")
    table.consume("k")  # usable again after a refused attempt


def test_session_table_is_bounded_and_returns_the_handle():
    table = SessionTable(capacity=2)
    for sid in ("a", "b", "c"):
        table.hand_off(sid, [f"rid-{sid}"])  # no lease: held until released or pushed out
    assert table.held() == 2
    assert table.release("a") == (False, None)  # the oldest went first
    assert table.release("c") == (True, ["rid-c"])
    for key in ("k1", "k2", "k3"):
        table.consume(key)
    table.consume("k1")  # pushed out of the bounded memory of used handoffs


@pytest.mark.parametrize("prompt, ids", [(None, [1, 2, 3]), ("the cat", None)])
def test_a_sealed_prompt_admits_only_itself(prompt, ids):
    attrs = seal(prompt, ids)
    check_seal(attrs, prompt, ids)
    with pytest.raises(RequestRejected, match="differs from the prompt"):
        check_seal(attrs, prompt and prompt + "!", ids and [1, 2, 4])
    if ids is not None:
        assert attrs == {"prompt_tokens": 3, "prompt_digest": prompt_digest(ids)}
        with pytest.raises(RequestRejected, match="2 prompt tokens, but the KV session holds KV for 3"):
            check_seal(attrs, None, [1, 2])
    else:
        assert attrs == {"prompt_digest": text_digest("the cat")}


def test_unsealed_and_other_kind_sessions_are_not_checked():
    check_seal({}, None, [1])
    check_seal(seal("text", None), None, [1, 2])  # text vs ids: only the engine's tokenizer could compare
    with pytest.raises(RequestRejected, match="prompt_digest: must be a string"):
        check_seal({"prompt_digest": 3}, None, [1])
