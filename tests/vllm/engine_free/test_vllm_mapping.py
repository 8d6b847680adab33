"""The vLLM adapter's pure translations (no engine needed): tables of cases."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import CandidateMode, FinishReason, Modality
from openengine_adapters.vllm import output_mapping as out
from openengine_adapters.vllm import request_mapping as req


def params(**kw) -> be.GenerateParams:
    return be.GenerateParams(request_id="r", model="m", prompt="hi", **kw)


@pytest.mark.parametrize("p,expected", [
    (params(), {"n": 1, "max_tokens": None}),
    (params(sampling=be.Sampling(temperature=0.0, top_k=0, seed=0)),
     {"n": 1, "max_tokens": None, "temperature": 0.0, "top_k": 0, "seed": 0}),
    (params(sampling=be.Sampling(num_sequences=3, top_p=0.5), stopping=be.Stopping(max_tokens=9, min_tokens=2)),
     {"n": 3, "max_tokens": 9, "top_p": 0.5, "min_tokens": 2}),
    (params(stopping=be.Stopping(stop_texts=("a",), stop_token_ids=(5,), ignore_eos=False,
                                 include_stop_in_output=True)),
     {"n": 1, "max_tokens": None, "stop": ["a"], "stop_token_ids": [5], "ignore_eos": False,
      "include_stop_str_in_output": True}),
    (params(logprobs=be.LogprobRequest(output=True)), {"n": 1, "max_tokens": None, "logprobs": 0}),
    (params(logprobs=be.LogprobRequest(output=True, output_candidates=be.CandidateSelection(CandidateMode.TOP_N,
                                                                                            top_n=3))),
     {"n": 1, "max_tokens": None, "logprobs": 3}),
    (params(logprobs=be.LogprobRequest(output=True, output_candidates=be.CandidateSelection(
        CandidateMode.TOKEN_IDS, token_ids=(4, 9))), bypass_prefix_cache=False),
     {"n": 1, "max_tokens": None, "logprob_token_ids": [4, 9], "skip_reading_prefix_cache": False}),
    (params(logprobs=be.LogprobRequest(prompt=True, output=True,
                                       output_candidates=be.CandidateSelection(CandidateMode.ALL),
                                       prompt_candidates=be.CandidateSelection(CandidateMode.ALL))),
     {"n": 1, "max_tokens": None, "logprobs": -1, "prompt_logprobs": -1}),
    (params(logprobs=be.LogprobRequest(prompt=True)), {"n": 1, "max_tokens": None, "prompt_logprobs": 0}),
    (params(metadata={"k": "v"}), {"n": 1, "max_tokens": None, "extra_args": {"openengine_metadata": {"k": "v"}}}),
])
def test_sampling_kwargs_pass_only_what_is_present(p, expected):
    assert req.sampling_kwargs(p) == expected


def test_prompt_input():
    assert req.prompt_input(params()) == {"prompt": "hi"}
    p = be.GenerateParams("r", "m", token_ids=(1, 2), cache_salt="s",
                          media=(be.Media(Modality.IMAGE, url="http://x", uuid="u1"), be.Media(Modality.IMAGE,
                                                                                                 url="http://y")))
    assert req.prompt_input(p, {"image": ["A", "B"]}) == {
        "prompt_token_ids": [1, 2], "cache_salt": "s", "multi_modal_data": {"image": ["A", "B"]},
        "multi_modal_uuids": {"image": ["u1", None]}}


@pytest.mark.parametrize("priority,engine", [(None, 0), (0, 0), (5, -5), (-3, 3)])
def test_priority_is_negated(priority, engine):
    assert req.engine_priority(priority) == engine


@dataclass
class Lp:
    logprob: float
    rank: int | None
    decoded_token: str | None = None


POS = {7: Lp(-0.1, 1, "a"), 3: Lp(-1.0, 2, "b"), 9: Lp(-2.0, 3, "c"), 42: Lp(-5.0, 40, "z")}


def test_token_logprob_top_n_keeps_true_ranks_and_drops_the_extra_chosen_entry():
    lp, text = out.token_logprob(POS, 42, be.CandidateSelection(CandidateMode.TOP_N, top_n=3))
    assert (lp.logprob, lp.rank, text) == (-5.0, 40, "z")
    assert [(c.token_id, c.rank) for c in lp.candidates] == [(7, 1), (3, 2), (9, 3)]


def test_token_logprob_explicit_ids_omit_list_position_ranks():
    pos = {3: Lp(-1.0, 1, "b"), 9: Lp(-2.0, 2, "c")}
    lp, _ = out.token_logprob(pos, 9, be.CandidateSelection(CandidateMode.TOKEN_IDS, token_ids=(9, 3)))
    assert [c.token_id for c in lp.candidates] == [9, 3] and all(c.rank is None for c in lp.candidates)
    assert lp.rank is None and lp.logprob == -2.0


def test_token_logprob_without_candidates_and_missing_position():
    lp, _ = out.token_logprob(POS, 7, None)
    assert (lp.logprob, lp.rank, lp.candidates) == (-0.1, 1, [])
    assert out.token_logprob(None, 7, None) == (None, "")


@pytest.mark.parametrize("reason,stop_reason,ids,expected", [
    (None, None, [1], (None, None, "")),
    ("stop", "END", [1], (FinishReason.STOP, be.StopMatch(stop_text="END"), "")),
    ("stop", 13, [13], (FinishReason.STOP, be.StopMatch(stop_token_id=13), "")),
    ("stop", None, [5, 2], (FinishReason.STOP, be.StopMatch(eos_token_id=2), "")),
    ("length", None, [1], (FinishReason.LENGTH, None, "")),
    ("abort", None, [], (None, None, "engine finished with 'abort'")),  # the backend ends the stream first
])
def test_finish_mapping(reason, stop_reason, ids, expected):
    assert out.finish(reason, stop_reason, ids, 2) == expected


@dataclass
class Comp:
    index: int
    token_ids: list
    text: str
    logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: object = None


@dataclass
class Out:
    outputs: list
    prompt_token_ids: list
    prompt_logprobs: list | None = None
    num_cached_tokens: int | None = 0


def test_output_translator_prompt_once_and_deltas():
    p = params(logprobs=be.LogprobRequest(prompt=True, prompt_start=1, output=True))
    tr = out.VllmOutputMapper(p, 2)
    first = tr.chunk(Out([Comp(0, [7], "a", [POS])], [1, 7, 3], [None, POS, POS]))
    assert first.prompt_tokens == 3 and [pt.token_id for pt in first.prompt] == [7, 3]
    assert first.outputs[0].logprobs[0].logprob == -0.1 and first.outputs[0].tokens == ["a"]
    second = tr.chunk(Out([Comp(0, [3], "b", [POS], "stop", None)], [1, 7, 3], None, 2))
    assert second.prompt is None and second.prompt_tokens is None and second.cached_prompt_tokens == 2
    assert second.outputs[0].finish_reason == FinishReason.STOP and second.outputs[0].stop.eos_token_id == 3


def test_unknown_finish_reason_is_an_engine_failure():
    tr = out.VllmOutputMapper(params(), 2)
    with pytest.raises(EngineFailure):
        tr.chunk(Out([Comp(0, [1], "x", None, "error")], [1]))

