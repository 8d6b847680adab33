"""The shared engine kit (openengine_adapters/engine_kit): pure pieces every adapter uses."""

from __future__ import annotations

import pytest

from openengine_adapters import backend as be
from openengine_adapters.engine_kit import card, outputs, scores
from openengine_adapters.engine_kit.sessions import SessionTable, check_seal, prompt_digest, seal, text_digest
from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import ErrorCode, Feature, FinishReason, ValueSemantics


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


# --------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("reason, matched, ids, eos_in_output, expected", [
    (None, None, [1], False, (None, None, "")),
    ("not_finished", None, [1], False, (None, None, "")),
    ("stop", "END", [1], False, (FinishReason.STOP, be.StopMatch(stop_text="END"), "")),
    ("stop", 13, [13], False, (FinishReason.STOP, be.StopMatch(stop_token_id=13), "")),
    ("stop", None, [5, 3], False, (FinishReason.STOP, be.StopMatch(eos_token_id=2), "")),  # the tokenizer's
    ("stop", None, [5, 3], True, (FinishReason.STOP, be.StopMatch(eos_token_id=3), "")),  # the one in the output
    ("length", None, [1], False, (FinishReason.LENGTH, None, "")),
    ("cancelled", None, [], False, (FinishReason.CANCELLED, None, "in the engine")),
    ("weird", None, [], False, (None, None, "engine finished with 'weird'")),
])
def test_finish(reason, matched, ids, eos_in_output, expected):
    engine = {"cancelled": (FinishReason.CANCELLED, "in the engine")}
    assert outputs.finish(reason, matched, ids, 2, eos_in_output=eos_in_output, engine_reasons=engine) == expected


def test_finite():
    assert [outputs.finite(x) for x in (-0.5, float("-inf"), float("nan"), None)] == [-0.5, None, None, None]


def test_cursor_holds_back_a_possible_stop_prefix_and_stamps_the_finish():
    c = outputs.OutputCursor(1)
    d = c.advance([1, 2], "hello EN", None, None, stops=("END",), id_holdback=1)
    assert (d.index, d.token_ids, d.text) == (1, [1], "hello ")  # "EN" and one token wait
    assert c.advance([1, 2], "hello EN", None, None, stops=("END",), id_holdback=1) is None
    d = c.advance([1, 2, 3], "hello ENJOY", None, None, stops=("END",), id_holdback=1)
    assert (d.token_ids, d.text) == ([2], "ENJOY")
    seen = []
    d = c.advance([1, 2, 3, 4], "hello ENJOY!", FinishReason.LENGTH, None, stops=("END",), id_holdback=1,
                  logprobs=lambda a, b: (seen.append((a, b)) or [be.TokenLogprob()] * (b - a), [""] * (b - a)))
    assert (d.token_ids, d.text, d.finish_reason, c.done) == ([3, 4], "!", FinishReason.LENGTH, True)
    assert seen == [(2, 4)] and len(d.logprobs) == 2


# --------------------------------------------------------------------------- card


def test_features_follow_the_card():
    gen = be.GenerationSupport(guided_decoding=card.guided_support(None))
    plain = be.ModelCard(model_id="m", served_model_name="m", generation=gen)
    assert card.features(plain, generate=True, runtime_events=False) == {
        Feature.ABORT, Feature.LOAD, Feature.GENERATE}
    scored = be.ModelCard(model_id="m", served_model_name="m", generation=gen, supports_lora=True,
                          tasks=be.TaskSupport(score=card.label_score_support(lora=True)))
    assert card.features(scored, generate=True, runtime_events=True, kv_events=True) == {
        Feature.ABORT, Feature.LOAD, Feature.GENERATE, Feature.RUNTIME_EVENTS, Feature.LORA, Feature.SCORE,
        Feature.KV_EVENTS}
    assert not card.guided_support(None).supported and card.guided_support(card.ALL_GUIDED).modes == card.ALL_GUIDED


# --------------------------------------------------------------------------- scores


def test_relevance_scores_follow_the_groups():
    item = be.TaskItem("q", text="q")
    p = be.ScoreParams(context=be.TaskContext("r", "m"), groups=(
        be.ScoreGroupInput("g1", item, (be.TaskItem("a", text="a"), be.TaskItem("b", text="b"))),
        be.ScoreGroupInput("g2", item, (be.TaskItem("c", text="c"),))))
    result = scores.relevance_score_result(p, [0.5, -1.0, 2.0], 12)
    assert [[list(c.scores.values) for c in row] for row in result.groups] == [[[0.5], [-1.0]], [[2.0]]]
    assert result.semantics == ValueSemantics.RELEVANCE and result.higher_is_better and result.usage.input_tokens == 12


class _Entry:
    def __init__(self, logprob: float, rank: int | None, text: str = "") -> None:
        self.logprob, self.rank, self.decoded_token = logprob, rank, text


def test_top_candidates_rank_order_cut_and_fillers():
    pos = {5: _Entry(-0.1, 1, "a"), 3: _Entry(-2.0, 3, "c"), 4: _Entry(-1.0, 2, "b"),
           9: _Entry(-7.0, 40, "chosen"), 8: _Entry(float("-inf"), 2), 6: _Entry(-0.5, None)}
    top2 = outputs.top_candidates(pos, 2, text=lambda e: e.decoded_token)
    assert [(c.token_id, c.rank, c.token) for c in top2] == [(5, 1, "a"), (4, 2, "b"), (8, 2, "")]
    assert [c.token_id for c in outputs.top_candidates(pos, 2, finite_only=True)] == [5, 4]
    assert [c.token_id for c in outputs.top_candidates(pos, None)] == [5, 4, 8, 3, 9]  # every ranked entry
