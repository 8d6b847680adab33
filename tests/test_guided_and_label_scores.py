"""Guide -> engine keyword arguments, and label-token score assembly (shared by the adapters)."""

import math
import re

import pytest

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.guided_kwargs import choice_regex, guide_kwargs
from openengine_adapters.engine_kit.scores import label_score_result
from openengine_adapters.types import GuidedMode, ScoreNormalization, ValueSemantics


@pytest.mark.parametrize("mode,value,native,as_regex", [
    (GuidedMode.JSON_SCHEMA, "{}", {"json": "{}"}, {"json": "{}"}),
    (GuidedMode.REGEX, "a+", {"regex": "a+"}, {"regex": "a+"}),
    (GuidedMode.EBNF_GRAMMAR, "g", {"grammar": "g"}, {"grammar": "g"}),
    (GuidedMode.STRUCTURAL_TAG, "{}", {"structural_tag": "{}"}, {"structural_tag": "{}"}),
    (GuidedMode.CHOICE, ("a", "b"), {"choice": ["a", "b"]}, {"regex": "(a|b)"}),
    (GuidedMode.JSON_OBJECT, None, {"json_object": True}, {"json_object": True}),
])
def test_guide_kwargs(mode, value, native, as_regex):
    assert guide_kwargs(be.Guided(mode, value)) == native
    assert guide_kwargs(be.Guided(mode, value), choice_as_regex=True) == as_regex


@pytest.mark.parametrize("choices, matches, rejects", [
    (("yes", "no"), ["yes", "no"], ["y", "yesno"]),
    (("a.b", "c|d", "(x)", "1+1"), ["a.b", "c|d", "(x)", "1+1"], ["axb", "c", "x", "11"]),
    (("a b", "-/"), ["a b", "-/"], ["ab"]),
])
def test_choice_regex_matches_exactly_the_choices(choices, matches, rejects):
    rx = re.compile(choice_regex(choices))
    assert all(rx.fullmatch(m) for m in matches)
    assert not any(rx.fullmatch(r) for r in rejects)


def score_params(normalization):
    item = be.TaskItem("x", text="t")
    groups = (be.ScoreGroupInput("g0", item, (be.TaskItem("a", text="a"), be.TaskItem("b", text="b"))),
              be.ScoreGroupInput("g1", item, (be.TaskItem("c", text="c"),)))
    return be.ScoreParams(be.TaskContext("r", "m"), groups, normalization=normalization, label_token_ids=(5, 9))


def test_label_scores_keep_request_order_and_log_probabilities():
    r = label_score_result(score_params(ScoreNormalization.UNSPECIFIED), [[-1, -2], [-3, -4], [-5, -6]], 12)
    assert [[c.scores.values for c in g] for g in r.groups] == [[[-1, -2], [-3, -4]], [[-5, -6]]]
    assert (r.semantics, r.normalization, tuple(r.label_token_ids), r.usage.input_tokens) == (
        ValueSemantics.LOG_PROBABILITIES, ScoreNormalization.NONE, (5, 9), 12)


def test_label_scores_softmax_across_labels():
    r = label_score_result(score_params(ScoreNormalization.SOFTMAX), [[0.0, math.log(3)], [-1, -1], [2, 2]], 0)
    assert r.groups[0][0].scores.values == pytest.approx([0.25, 0.75])
    assert r.groups[1][0].scores.values == pytest.approx([0.5, 0.5])
    assert r.semantics == ValueSemantics.PROBABILITIES and r.normalization == ScoreNormalization.SOFTMAX
