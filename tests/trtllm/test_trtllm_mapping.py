"""Tables of cases for the pure translations (no server)."""

from __future__ import annotations

from types import SimpleNamespace

import fake_trtllm
import pytest

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.stop_text import stop_prefix_len
from openengine_adapters.errors import EngineFailure, RequestRejected
from openengine_adapters.trtllm import disagg as dis
from openengine_adapters.trtllm import kv_event_mapping as kvm
from openengine_adapters.trtllm import output_mapping as outs
from openengine_adapters.trtllm import request_mapping as req
from openengine_adapters.types import CandidateMode, FinishReason, StorageMedium
from openengine_adapters.validation.generate import check_room


def params(**kw) -> be.GenerateParams:
    return be.GenerateParams(request_id="r", model="m", token_ids=(1, 2), **kw)


@pytest.mark.parametrize("max_tokens, prompt_len, ctx", [
    (5, 2, 100), (None, 2, 100),   # none: the worker deduces the room itself (_deduce_max_tokens)
    (None, 99, 100), (5, 2, None), (None, 2, None),  # no context length known: still the engine's to deduce
])
def test_max_tokens_as_asked_when_it_fits(max_tokens, prompt_len, ctx):
    check_room(prompt_len, max_tokens, ctx)
    assert req.sampling_kwargs(params(stopping=be.Stopping(max_tokens=max_tokens)))["max_tokens"] == max_tokens


@pytest.mark.parametrize("max_tokens, prompt_len, ctx, fragment", [
    (None, 100, 100, "no room"),
    (10, 95, 100, "exceeds the context"),  # TensorRT-LLM would clamp silently
])
def test_max_tokens_rejected(max_tokens, prompt_len, ctx, fragment):
    with pytest.raises(RequestRejected, match=fragment):
        check_room(prompt_len, max_tokens, ctx)


DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


@pytest.mark.parametrize("p, expected", [
    (params(), {"n": 1, "max_tokens": None, **DEFAULTS}),
    (params(sampling=be.Sampling(temperature=0.0, top_k=-1, seed=0, num_sequences=2)),
     {"n": 2, "max_tokens": None, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}),
    (params(stopping=be.Stopping(max_tokens=3, min_tokens=1, stop_texts=("x",), stop_token_ids=(5,),
                                 ignore_eos=False, include_stop_in_output=True)),
     {"n": 1, "max_tokens": 3, "min_tokens": 1, "stop": ["x"], "stop_token_ids": [5], "ignore_eos": False,
      "include_stop_str_in_output": True, **DEFAULTS}),
    (params(logprobs=be.LogprobRequest(output=True)), {"n": 1, "max_tokens": None, "logprobs": 1, **DEFAULTS}),
    (params(logprobs=be.LogprobRequest(output=True, output_candidates=be.CandidateSelection(CandidateMode.TOP_N, 4),
                                       prompt=True)),
     {"n": 1, "max_tokens": None, "logprobs": 4, "prompt_logprobs": 1, **DEFAULTS}),
])
def test_sampling_kwargs(p, expected):
    assert req.sampling_kwargs(p) == expected


@pytest.mark.parametrize("reason, stop_reason, expected", [
    (None, None, (None, None)),
    ("not_finished", None, (None, None)),
    ("stop", "ab", (FinishReason.STOP, be.StopMatch(stop_text="ab"))),
    ("stop", 7, (FinishReason.STOP, be.StopMatch(stop_token_id=7))),
    ("stop", None, (FinishReason.STOP, be.StopMatch(eos_token_id=2))),
    ("length", None, (FinishReason.LENGTH, None)),
    ("cancelled", None, (FinishReason.CANCELLED, None)),
    ("timeout", None, (FinishReason.CANCELLED, None)),
    ("weird", None, (None, None)),
])
def test_finish(reason, stop_reason, expected):
    assert outs.finish(reason, stop_reason, [5], 2)[:2] == expected


@pytest.mark.parametrize("text, stops, expected", [
    ("hello wo", ("world",), 2), ("hello", ("world",), 0), ("abc", ("c", "bcd"), 2), ("", ("x",), 0),
    ("xx", ("xyz", "xxq"), 2),
])
def test_stop_prefix_len(text, stops, expected):
    assert stop_prefix_len(text, stops) == expected


def test_token_logprob_topn_and_missing():
    L = fake_trtllm.Logprob
    pos = {5: L(-0.1, 1), 6: L(-0.5, 2), 7: L(-0.9, 3), 9: L(-4.0, 40)}
    out = outs.token_logprob(pos, 9, be.CandidateSelection(CandidateMode.TOP_N, 2))
    assert (out.logprob, out.rank) == (-4.0, 40) and [c.token_id for c in out.candidates] == [5, 6]
    out = outs.token_logprob(pos, 8, None)
    assert out.logprob is None and out.rank is None and not out.candidates
    assert outs.token_logprob(None, 5, None) is None


def comp(index, ids, text, reason=None, stop_reason=None, logprobs=None, stale=None):
    c = fake_trtllm.CompletionOutput(index, text, list(ids), logprobs or [], [], reason, stop_reason)
    if stale is not None:  # *_diff would lie: the translator must not care
        c._last_token_ids_len, c._last_text_len = stale, stale
    return c


def out(*comps, finished=False, prompt=(1, 2)):
    return SimpleNamespace(outputs=list(comps), prompt_token_ids=list(prompt), finished=finished, cached_tokens=0)


def test_translator_cumulative_n2_with_stale_diffs():
    t = outs.TrtllmOutputMapper(params(sampling=be.Sampling(num_sequences=2)), 2)
    a = t.chunk(out(comp(0, [1], "a"), comp(1, [], "")))
    assert [(d.index, list(d.token_ids), d.text) for d in a.outputs] == [(0, [1], "a")]
    b = t.chunk(out(comp(0, [1], "a", stale=0), comp(1, [4, 5], "de")))
    assert [(d.index, list(d.token_ids), d.text) for d in b.outputs] == [(1, [4, 5], "de")]
    c = t.chunk(out(comp(0, [1, 2], "ab", "length"), comp(1, [4, 5], "de", stale=0)))
    assert [(d.index, list(d.token_ids), d.text, d.finish_reason) for d in c.outputs] == \
        [(0, [2], "b", FinishReason.LENGTH)]
    d = t.chunk(out(comp(0, [1, 2], "ab", "length"), comp(1, [4, 5, 6], "def", "stop", 6), finished=True))
    assert [(x.index, list(x.token_ids), x.finish_reason) for x in d.outputs] == [(1, [6], FinishReason.STOP)]
    assert t.unfinished() == []


def test_translator_stop_holdback_and_truncation():
    p = params(stopping=be.Stopping(stop_texts=("wor",)))
    t = outs.TrtllmOutputMapper(p, 2, stop_token_holdback=2)
    assert t.chunk(out(comp(0, [104, 32, 119], "h w"))).outputs[0].text == "h "
    c = t.chunk(out(comp(0, [104, 32, 119, 111], "h wo"))).outputs
    assert c == [] or (c[0].text == "" and list(c[0].token_ids) == [32])
    fin = t.chunk(out(comp(0, [104, 32], "h ", "stop", "wor"), finished=True)).outputs[0]
    assert fin.finish_reason == FinishReason.STOP and fin.stop.stop_text == "wor" and fin.text == ""


def test_translator_inferred_finish_when_request_final():
    t = outs.TrtllmOutputMapper(params(sampling=be.Sampling(num_sequences=2)), 2)
    t.max_tokens = 2
    c = t.chunk(out(comp(0, [7, 8], "xy"), comp(1, [3, 4], "ab", "length"), finished=True))
    assert {d.index: d.finish_reason for d in c.outputs} == {0: FinishReason.LENGTH, 1: FinishReason.LENGTH}


def test_translator_unknown_reason_is_engine_failure():
    t = outs.TrtllmOutputMapper(params(), 2)
    with pytest.raises(EngineFailure):
        t.chunk(out(comp(0, [1], "a", "exploded"), finished=True))


STATE = "AHN0YXRl"  # base64 of b"\0state"
ENGINE_1_2 = frozenset({"request_type", "first_gen_tokens", "ctx_request_id", "opaque_state", "draft_tokens"})
ENGINE_MAIN = ENGINE_1_2 | {"disagg_request_id", "ctx_dp_rank", "ctx_info_endpoint"}


def session(session_id="1", dp_rank=0, **attrs):
    return be.KvSession(session_id=session_id, dp_rank=dp_rank, attributes=attrs)


@pytest.mark.parametrize("ref, fragment", [
    (session(), "first_gen_tokens"),
    (session("x", first_gen_tokens=[1], opaque_state=STATE), "session_id"),
    (session(ctx_request_id=1.5, first_gen_tokens=[1], opaque_state=STATE), "ctx_request_id"),
    (session(ctx_request_id=True, first_gen_tokens=[1], opaque_state=STATE), "ctx_request_id"),
    (session(first_gen_tokens=[], opaque_state=STATE), "first_gen_tokens"),
    (session(first_gen_tokens=[1.0], opaque_state=5), "opaque_state"),
    (session(first_gen_tokens=[1.0], opaque_state="%%"), "opaque_state"),
    (session(first_gen_tokens=[1.0]), "opaque_state"),  # nothing locates the context worker
    (session(first_gen_tokens=[1.0], opaque_state=None), "opaque_state"),
    (session(first_gen_tokens=[1.0], ctx_info_endpoint="tcp://h:1"), "ctx_info_endpoint"),  # 1.2 has none
    (session(first_gen_tokens=[1.0], opaque_state=STATE, draft_tokens="x"), "draft_tokens"),
    (session(first_gen_tokens=[1.0], opaque_state=STATE, disagg_request_id="9"), "disagg_request_id"),
])
def test_decode_disaggregated_rejects(ref, fragment):
    with pytest.raises(RequestRejected, match=fragment):
        dis.decode_disaggregated(ref, ENGINE_1_2)


def test_disaggregated_round_trip_and_big_ids():
    dp = fake_trtllm.DisaggregatedParams(request_type="context_only", first_gen_tokens=[5], ctx_request_id=2**60,
                                         opaque_state=b"\x00\xff", draft_tokens=[7, 8])
    sid, rank, attrs = dis.encode_disaggregated(dp, "req")
    assert (sid, rank) == (str(2**60), 0) and "ctx_request_id" not in attrs
    back = dis.decode_disaggregated(be.KvSession(sid, attributes=attrs), ENGINE_1_2)
    assert back == {"request_type": "generation_only", "ctx_request_id": 2**60, "first_gen_tokens": [5],
                    "opaque_state": b"\x00\xff", "draft_tokens": [7, 8]}


def test_sessions_of_tensorrt_llms_own_server_are_consumed():
    """What tensorrt_llm/grpc/openengine/disagg.py prefill_ready_response emits (main): session_id is
    the context request id, disagg_request_id a string, ctx_info_endpoint, ctx_dp_rank; its extra
    keys (ctx_usage, schedule_style, first_gen_log_probs) are informational and ignored."""
    theirs = session("42", 1, opaque_state=STATE, first_gen_tokens=[104], disagg_request_id="77", ctx_dp_rank=1,
                     ctx_info_endpoint="tcp://10.0.0.1:5555", ctx_usage={"prompt_tokens": 3.0}, schedule_style=0)
    kw = dis.decode_disaggregated(theirs, ENGINE_MAIN)
    assert kw == {"request_type": "generation_only", "ctx_request_id": 42, "first_gen_tokens": [104],
                  "opaque_state": b"\0state", "ctx_info_endpoint": "tcp://10.0.0.1:5555", "disagg_request_id": 77,
                  "ctx_dp_rank": 1}
    # an endpoint alone locates the context worker where the engine takes one
    assert dis.decode_disaggregated(session("42", first_gen_tokens=[1], ctx_info_endpoint="tcp://h:1"),
                                   ENGINE_MAIN)["ctx_info_endpoint"] == "tcp://h:1"
    # sessions this adapter issued before the shared layout (ctx_request_id in the attributes)
    assert dis.decode_disaggregated(session("p1", ctx_request_id=5, first_gen_tokens=[1], opaque_state=STATE),
                                   ENGINE_1_2)["ctx_request_id"] == 5


def test_encode_in_the_shared_layout():
    dp = SimpleNamespace(ctx_request_id=3, first_gen_tokens=[5], opaque_state=None, draft_tokens=None,
                         disagg_request_id=2**60, ctx_dp_rank=1, ctx_info_endpoint="tcp://h:1")
    sid, rank, attrs = dis.encode_disaggregated(dp)
    assert (sid, rank) == ("3", 1)
    assert attrs == {"first_gen_tokens": [5], "disagg_request_id": str(2**60), "ctx_dp_rank": 1,
                     "ctx_info_endpoint": "tcp://h:1"}


@pytest.mark.parametrize("value, hexed", [(1, "0000000000000001"), (-1, "ffffffffffffffff"),
                                          (2**64 - 1, "ffffffffffffffff")])
def test_block_hash(value, hexed):
    h = kvm.block_hash(value)
    assert h.value.hex() == hexed and h.encoding == "int64"


def test_medium():
    assert (kvm.medium(0), kvm.medium(1), kvm.medium(9)) == (StorageMedium.GPU, StorageMedium.CPU_PINNED,
                                                          StorageMedium.UNSPECIFIED)


def test_translator_decodes_incrementally_and_waits_for_whole_characters():
    """Token 200 is the first byte of 'é' (decoded alone as U+FFFD), 201 the second."""
    def decode(ids):
        text, i = "", 0
        while i < len(ids):
            if ids[i] == 200:
                text += "é" if i + 1 < len(ids) and ids[i + 1] == 201 else "\ufffd"
                i += 2 if i + 1 < len(ids) and ids[i + 1] == 201 else 1
            else:
                text += chr(ids[i])
                i += 1
        return text

    t = outs.TrtllmOutputMapper(params(), 2, decode=decode)
    c1 = t.chunk(out(comp(0, [65, 200], "engine text ignored")))
    assert [(d.token_ids, d.text) for d in c1.outputs] == [([65, 200], "")]  # "A\ufffd": wait for the rest
    c2 = t.chunk(out(comp(0, [65, 200, 201, 66], "")))
    assert [(d.token_ids, d.text) for d in c2.outputs] == [([201, 66], "AéB")]
    c3 = t.chunk(out(comp(0, [65, 200, 201, 66], "", "length"), finished=True))
    assert c3.outputs[0].finish_reason == FinishReason.LENGTH and c3.outputs[0].text == ""


def test_translator_infers_a_stop_word_on_a_sequence_without_a_reason():
    t = outs.TrtllmOutputMapper(params(sampling=be.Sampling(num_sequences=2), stopping=be.Stopping(stop_texts=("xy",))),
                            2, decode=lambda ids: "".join(map(chr, ids)), stop_ids={"xy": [120, 121]})
    c = t.chunk(out(comp(0, [97, 120, 121], ""), comp(1, [98, 99], "", "length"), finished=True))
    d0 = next(d for d in c.outputs if d.index == 0)
    assert d0.finish_reason == FinishReason.STOP and d0.stop.stop_text == "xy"
    assert (d0.token_ids, d0.text) == ([97], "a")
