"""The SGLang adapter's pure translations (no engine, no SGLang import): tables of cases."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure, RequestRejected
from openengine_adapters.sglang import disagg as dis
from openengine_adapters.sglang import load_mapping as load
from openengine_adapters.sglang import output_mapping as out
from openengine_adapters.sglang import request_mapping as req
from openengine_adapters.types import CandidateMode, ErrorCode, FinishReason, GuidedMode


def params(**kw) -> be.GenerateParams:
    kw.setdefault("prompt", "hi")
    return be.GenerateParams(request_id="r", model="m", **kw)


def test_package_imports_without_sglang():
    assert "sglang" not in sys.modules


# --------------------------------------------------------------------------- request ids


def test_engine_rids_never_prefix_each_other():
    ids = req.engine_rids("req", 12) + req.engine_rids("req", 12) + req.engine_rids("req1", 3) + req.engine_rids("r", 2)
    assert len(set(ids)) == len(ids)
    for a in ids:
        for b in ids:
            assert a == b or not b.startswith(a), (a, b)
    assert req.engine_rids("x", 2, salt="s") == ["oes-0|x", "oes-1|x"]


def test_derived_seeds():
    assert req.derived_seed(5, 0) == 5
    assert req.derived_seed(2**64 - 1, 0) == -1  # uint64 -> SGLang's int64
    seeds = {req.derived_seed(5, i) for i in range(1, 50)}
    assert len(seeds) == 49 and all(0 <= s < 2**63 for s in seeds) and 5 not in seeds
    assert req.derived_seed(5, 3) == req.derived_seed(5, 3)


# --------------------------------------------------------------------------- sampling params


@pytest.mark.parametrize("p,expected", [
    (params(), {"max_new_tokens": None}),
    (params(stopping=be.Stopping(max_tokens=0)), {"max_new_tokens": 0}),
    (params(sampling=be.Sampling(temperature=0.0, top_p=0.5, top_k=0, min_p=0.1, frequency_penalty=0.0,
                                 presence_penalty=0.5, repetition_penalty=1.1)),
     {"max_new_tokens": None, "temperature": 0.0, "top_p": 0.5, "top_k": -1, "min_p": 0.1,
      "frequency_penalty": 0.0, "presence_penalty": 0.5, "repetition_penalty": 1.1}),
    (params(sampling=be.Sampling(top_k=7, seed=3)), {"max_new_tokens": None, "top_k": 7, "sampling_seed": 3}),
    (params(stopping=be.Stopping(max_tokens=9, min_tokens=2, stop_texts=("a", "b"), stop_token_ids=(5,),
                                 ignore_eos=False, include_stop_in_output=True)),
     {"max_new_tokens": 9, "min_new_tokens": 2, "stop": ["a", "b"], "stop_token_ids": [5], "ignore_eos": False,
      "no_stop_trim": True}),
    (params(stopping=be.Stopping(stop_token_ids=(5,), ignore_eos=True)),
     {"max_new_tokens": None, "stop_token_ids": [5], "ignore_eos": True}),
])
def test_sampling_params(p, expected):
    assert req.sampling_params(p) == expected


def test_sampling_params_per_index_seed_and_default_max():
    p = params(sampling=be.Sampling(seed=11, num_sequences=3))
    assert [req.sampling_params(p, i)["sampling_seed"] for i in range(3)] == [11, req.derived_seed(11, 1),
                                                                            req.derived_seed(11, 2)]
    assert req.sampling_params(params())["max_new_tokens"] is None  # explicit: SGLang's default would be 128


@pytest.mark.parametrize("mode,value,expected", [
    (GuidedMode.JSON_SCHEMA, '{"type": "string"}', {"json_schema": '{"type": "string"}'}),
    (GuidedMode.REGEX, "[ab]+", {"regex": "[ab]+"}),
    (GuidedMode.EBNF_GRAMMAR, 'root ::= "a"', {"ebnf": 'root ::= "a"'}),
    (GuidedMode.STRUCTURAL_TAG, "{}", {"structural_tag": "{}"}),
    (GuidedMode.CHOICE, ("yes", "a.b"), {"regex": "(yes|a\\.b)"}),
    (GuidedMode.JSON_OBJECT, None, {"json_schema": json.dumps({"type": "object"})}),
])
def test_guided_lowering(mode, value, expected):
    assert req.guided_kwargs(be.Guided(mode, value)) == expected
    assert expected.items() <= req.sampling_params(params(guided=be.Guided(mode, value))).items()


def test_request_kwargs():
    p = params(lora_name="ad", priority=3, cache_salt="s", data_parallel_rank=1)
    assert req.request_kwargs(p, "rid") == {
        "rid": "rid", "stream": True, "sampling_params": {"max_new_tokens": None}, "text": "hi",
        "lora_path": "ad", "priority": 3, "cache_salt": "s", "routed_dp_rank": 1}
    kw = req.request_kwargs(params(prompt=None, token_ids=(1, 2)), "rid", disagg={"bootstrap_room": 5})
    assert kw["input_ids"] == [1, 2] and "text" not in kw and kw["bootstrap_room"] == 5
    # OpenEngine runs higher priorities first; --schedule-low-priority-values-first runs lower values
    # first, so the value is negated rather than the request refused (as vLLM's priority policy)
    assert req.request_kwargs(p, "rid", low_priority_first=True)["priority"] == -3


@pytest.mark.parametrize("lp,expected", [
    (be.LogprobRequest(output=True),
     {"return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": -1}),
    (be.LogprobRequest(output=True, output_candidates=be.CandidateSelection(CandidateMode.TOP_N, top_n=3)),
     {"return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": -1, "top_logprobs_num": 3}),
    (be.LogprobRequest(output=True, output_candidates=be.CandidateSelection(CandidateMode.TOKEN_IDS,
                                                                            token_ids=(4, 9))),
     {"return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": -1,
      "token_ids_logprob": [4, 9]}),
    (be.LogprobRequest(prompt=True, prompt_start=3,
                       prompt_candidates=be.CandidateSelection(CandidateMode.TOP_N, top_n=2),
                       output=True, output_candidates=be.CandidateSelection(CandidateMode.TOP_N, top_n=5)),
     {"return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": 2, "top_logprobs_num": 5}),
    (be.LogprobRequest(prompt=True),
     {"return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": 0}),
])
def test_logprob_kwargs(lp, expected):
    kw = req.request_kwargs(params(logprobs=lp), "rid")
    got = {k: v for k, v in kw.items() if k not in ("rid", "stream", "sampling_params", "text")}
    assert got == expected


# --------------------------------------------------------------------------- disaggregation


def test_session_round_trip():
    attrs = dis.encode_session("10.0.0.1", 8998, 2**60 + 3, 1)
    assert attrs["bootstrap_room"] == str(2**60 + 3)  # above 2^53: a string in the Struct
    assert dis.decode_session(attrs) == {"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998,
                                       "bootstrap_room": 2**60 + 3, "disagg_prefill_dp_rank": 1}
    small = dis.encode_session("h", 1, 77, 0)
    assert small["bootstrap_room"] == 77
    # Struct numbers arrive as doubles
    assert dis.decode_session({"bootstrap_host": "h", "bootstrap_port": 1.0, "bootstrap_room": 77.0})[
        "bootstrap_room"] == 77
    assert 0 <= dis.new_bootstrap_room() < 2**63


@pytest.mark.parametrize("attrs,field", [
    ({"bootstrap_port": 1, "bootstrap_room": 1}, "bootstrap_host"),
    ({"bootstrap_host": "h", "bootstrap_room": 1}, "bootstrap_port"),
    ({"bootstrap_host": "h", "bootstrap_port": 1}, "bootstrap_room"),
    ({"bootstrap_host": "", "bootstrap_port": 1, "bootstrap_room": 1}, "bootstrap_host"),
    ({"bootstrap_host": "h", "bootstrap_port": 70000, "bootstrap_room": 1}, "bootstrap_port"),
    ({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": -1}, "bootstrap_room"),
    ({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1.5}, "bootstrap_room"),
    ({"bootstrap_host": "h", "bootstrap_port": True, "bootstrap_room": 1}, "bootstrap_port"),
    ({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1, "prefill_dp_rank": -2}, "prefill_dp_rank"),
])
def test_decode_session_rejects(attrs, field):
    with pytest.raises(RequestRejected) as exc:
        dis.decode_session(attrs)
    assert f"attributes_struct.{field}" in exc.value.message


# --------------------------------------------------------------------------- finish reasons


@pytest.mark.parametrize("reason,expected", [
    (None, (None, None, "", False)),
    ({"type": "length", "length": 4}, (FinishReason.LENGTH, None, "", False)),
    ({"type": "stop", "matched": "ab"}, (FinishReason.STOP, be.StopMatch(stop_text="ab"), "", False)),
    ({"type": "stop", "matched": 9}, (FinishReason.STOP, be.StopMatch(stop_token_id=9), "", False)),
    ({"type": "stop", "matched": 2}, (FinishReason.STOP, be.StopMatch(eos_token_id=2), "", False)),
    ({"type": "stop", "matched": None}, (FinishReason.STOP, be.StopMatch(eos_token_id=2), "", False)),
    ({"type": "abort", "message": "Aborted"}, (None, None, "Aborted", True)),
])
def test_finish(reason, expected):
    assert out.finish(reason, 2, 5) == expected


def test_abort_failures():
    assert out.abort_failure({"type": "abort", "message": "Aborted", "status_code": None}) is None
    bad = out.abort_failure({"type": "abort", "message": "too long", "status_code": 400})
    assert isinstance(bad, EngineFailure) and bad.code == ErrorCode.INVALID_ARGUMENT
    assert out.abort_failure({"type": "abort", "message": "KV transfer failed", "status_code": 500}).code == \
        ErrorCode.KV_TRANSFER_FAILED
    assert out.abort_failure({"type": "abort", "message": "boom", "status_code": 500}).code == ErrorCode.INTERNAL


# --------------------------------------------------------------------------- cumulative -> deltas


def chunk(ids, text, reason=None, **meta):
    return {"output_ids": ids, "text": text, "meta_info": {"finish_reason": reason, **meta}}


def test_cumulative_chunks_become_deltas_and_are_copied():
    tr = out.SglangOutputMapper(params(), 1, eos_token_id=2)
    live = [5, 6]
    d1 = tr.delta(chunk(live, "ab"))
    live.append(7)  # SGLang extends its live list after we return
    assert (d1.index, list(d1.token_ids), d1.text) == (1, [5, 6], "ab")
    d2 = tr.delta(chunk(live, "abc"))
    assert (list(d2.token_ids), d2.text, d2.finish_reason) == ([7], "c", None)
    assert tr.delta(chunk(live, "abc")) is None  # nothing new
    d3 = tr.delta(chunk([5, 6, 7, 2], "abc", {"type": "stop", "matched": 2}))
    assert (list(d3.token_ids), d3.text, d3.finish_reason, d3.stop) == (
        [2], "", FinishReason.STOP, be.StopMatch(eos_token_id=2))
    assert tr.done and tr.engine_done
    assert tr.delta(chunk([5, 6, 7, 2, 9], "abcd")) is None  # nothing after the finish


def test_stop_string_prefix_is_held_back():
    tr = out.SglangOutputMapper(params(stopping=be.Stopping(stop_texts=("xyz",))), 0, 2)
    assert tr.delta(chunk([1], "ab")).text == "ab"
    d = tr.delta(chunk([1, 2], "abxy"))  # "xy" may start "xyz": held back, tokens are not
    assert (list(d.token_ids), d.text) == ([2], "")
    d = tr.delta(chunk([1, 2, 3], "abxyq"))  # ruled out: released
    assert d.text == "xyq"
    d = tr.delta(chunk([1, 2, 3, 4, 5], "abxyq", {"type": "stop", "matched": "xyz"}))
    assert (d.text, d.finish_reason, d.stop.stop_text) == ("", FinishReason.STOP, "xyz")


def test_include_stop_in_output_holds_nothing_back():
    tr = out.SglangOutputMapper(params(stopping=be.Stopping(stop_texts=("xyz",), include_stop_in_output=True)), 0, 2)
    assert tr.delta(chunk([1, 2], "abxy")).text == "abxy"


def test_adapter_matches_stop_tokens_under_ignore_eos():
    """SGLang ignores stop_token_ids with ignore_eos: the translator matches them (after min_tokens)."""
    st = be.Stopping(stop_token_ids=(9,), ignore_eos=True, min_tokens=2)
    tr = out.SglangOutputMapper(params(stopping=st), 0, 2, decode=lambda ids: "".join(chr(96 + i) for i in ids))
    d = tr.delta(chunk([9, 1], "ia"))  # 9 within min_tokens: not a stop
    assert list(d.token_ids) == [9, 1] and d.finish_reason is None
    d = tr.delta(chunk([9, 1, 3, 9, 4], "iacid"))
    assert list(d.token_ids) == [3, 9] and d.text == "c"  # cut after the stop token, its text trimmed
    assert d.finish_reason == FinishReason.STOP and d.stop == be.StopMatch(stop_token_id=9)
    assert tr.done and not tr.engine_done  # the backend must abort the rest of the SGLang request
    keep = out.SglangOutputMapper(params(stopping=be.Stopping(stop_token_ids=(9,), ignore_eos=True,
                                                          include_stop_in_output=True)), 0, 2,
                              decode=lambda ids: "".join(chr(96 + i) for i in ids))
    assert keep.delta(chunk([1, 9, 4], "aid")).text == "ai"


def test_abort_chunk_marks_the_output():
    tr = out.SglangOutputMapper(params(), 0, 2)
    assert tr.delta(chunk([1], "a", {"type": "abort", "message": "Aborted", "status_code": None})) is None
    assert tr.done and tr.aborted["type"] == "abort"


def test_unknown_finish_is_an_engine_failure():
    tr = out.SglangOutputMapper(params(), 0, 2)
    with pytest.raises(EngineFailure):
        tr.delta(chunk([1], "a", {"type": "weird"}))


# --------------------------------------------------------------------------- logprobs


def test_output_logprobs_top_n_and_token_ids():
    sel = be.CandidateSelection(CandidateMode.TOP_N, top_n=2)
    tr = out.SglangOutputMapper(params(logprobs=be.LogprobRequest(output=True, output_candidates=sel)), 0, 2)
    meta = {"output_token_logprobs": [(-0.5, 5, "a"), (-1.5, 6, "b")],
            "output_top_logprobs": [[(-0.5, 5, "a"), (-1.0, 8, "c"), (-2.0, 9, "d")],
                                    [(-1.0, 7, "x"), (-1.5, 6, "b")]]}
    d = tr.delta(chunk([5, 6], "ab", **meta))
    assert d.tokens == ["a", "b"]
    first, second = d.logprobs
    assert (first.logprob, first.rank) == (-0.5, 1)
    assert [(c.token_id, c.rank) for c in first.candidates] == [(5, 1), (8, 2)]
    assert (second.logprob, second.rank) == (-1.5, 2)
    ids_sel = be.CandidateSelection(CandidateMode.TOKEN_IDS, token_ids=(4,))
    tr = out.SglangOutputMapper(params(logprobs=be.LogprobRequest(output=True, output_candidates=ids_sel)), 0, 2)
    d = tr.delta(chunk([5], "a", output_token_logprobs=[(-0.5, 5, "a")],
                       output_token_ids_logprobs=[[(-3.0, 4, "q")]]))
    (lp,) = d.logprobs
    assert lp.rank is None and [(c.token_id, c.logprob, c.rank) for c in lp.candidates] == [(4, -3.0, None)]


def test_prompt_tokens():
    sel = be.CandidateSelection(CandidateMode.TOP_N, top_n=1)
    p = params(logprobs=be.LogprobRequest(prompt=True, prompt_candidates=sel))
    meta = {"input_token_logprobs": [(None, 1, "<s>"), (-2.0, 5, "a")],
            "input_top_logprobs": [None, [(-1.0, 7, "x"), (-2.0, 5, "a")]]}
    first, second = out.prompt_tokens(p, meta)
    assert (first.token_id, first.token, first.logprob.logprob, first.logprob.candidates) == (1, "<s>", None, [])
    assert (second.token_id, second.logprob.logprob, second.logprob.rank) == (5, -2.0, 2)
    assert [c.token_id for c in second.logprob.candidates] == [7]
    # a start > 0: SGLang was asked one position earlier (left unscored), which is dropped
    p = params(logprobs=be.LogprobRequest(prompt=True, prompt_start=1))
    (tok,) = out.prompt_tokens(p, {"input_token_logprobs": [(None, 1, "<s>"), (-2.0, 5, "a")]})
    assert (tok.token_id, tok.logprob.logprob) == (5, -2.0)


# --------------------------------------------------------------------------- load and KV config


def test_load_snapshot_in_pages():
    loads = [SimpleNamespace(dp_rank=0, num_running_reqs=2, num_waiting_reqs=1, num_used_tokens=9,
                             max_total_num_tokens=8192, num_waiting_uncached_tokens=30, timestamp=2.5),
             SimpleNamespace(dp_rank=1, num_running_reqs=0, num_waiting_reqs=0, num_used_tokens=0,
                             max_total_num_tokens=8192, num_waiting_uncached_tokens=0, timestamp=2.0)]
    snap = load.load_snapshot(loads, 4, per_rank=True)
    assert (snap.running_requests, snap.queued_requests, snap.used_kv_blocks, snap.total_kv_blocks) == (2, 1, 3, 4096)
    assert (snap.running_tokens, snap.waiting_tokens, snap.timestamp_unix_nanos) == (9, 30, 2_500_000_000)
    assert [r.data_parallel_rank for r in snap.ranks] == [0, 1] and snap.ranks[0].used_kv_blocks == 3
    assert load.load_snapshot(loads, 4, per_rank=False).ranks == ()
    empty = load.load_snapshot([], 1, per_rank=False)
    assert empty.running_requests is None and empty.total_kv_blocks is None


def test_kv_events_config():
    assert req.kv_events_config(None) is None
    assert req.kv_events_config('{"publisher": "null"}') is None
    cfg = req.kv_events_config('{"publisher": "zmq", "topic": "kv"}')
    assert cfg == {"publisher": "zmq", "topic": "kv", "endpoint": "tcp://*:5557"}


def test_load_counts_what_is_in_flight_the_moment_it_is():
    """SGLang's get_loads snapshot lags (published on a prefill, then every 15 decode steps): a request
    the adapter holds and SGLang does not report queued is running (issue 24: running 0 while one ran)."""
    lagging = be.LoadSnapshot(running_requests=0, queued_requests=0)
    assert load.with_in_flight(lagging, 2).running_requests == 2
    queued = be.LoadSnapshot(running_requests=0, queued_requests=1)
    assert load.with_in_flight(queued, 2).running_requests == 1
    ahead = be.LoadSnapshot(running_requests=3, queued_requests=0)  # never lowered below SGLang's own count
    assert load.with_in_flight(ahead, 1).running_requests == 3
    assert load.with_in_flight(be.LoadSnapshot(), 2).running_requests is None  # unreported stays so
