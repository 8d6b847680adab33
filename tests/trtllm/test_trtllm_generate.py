"""Generate through real gRPC against TrtllmBackend on the fake TensorRT-LLM."""

from __future__ import annotations

import json

import fake_trtllm
import grpc
import pytest
from helpers import collect, eventually, expect_status, gen_request, read_rest
from stream_contract import check_generate_stream

from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, kv_pb2, lifecycle_pb2, model_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TEXT = fake_trtllm.TEXT


def expected(n_tokens: int, index: int = 0, seed: int = 0, shift: int = 0) -> str:
    return "".join(TEXT[(t + 3 * index + seed + shift) % len(TEXT)] for t in range(n_tokens))


async def run(trt, req, **kw):
    return check_generate_stream(req, await collect(trt.stub, req), **kw)


async def test_text_prompt_length_and_usage(trt):
    req = gen_request("hi", request_id="a", stopping=g.StoppingOptions(max_tokens=7))
    s = await run(trt, req)
    assert s.text[0] == expected(7)
    assert s.token_ids[0] == [ord(c) for c in expected(7)]
    assert s.finished[0].reason == g.FINISH_REASON_LENGTH
    assert (s.usage.prompt_tokens, s.usage.completion_tokens) == (3, 7)  # BOS + "hi"
    assert trt.llm.submitted[-1]["streaming"] is True


async def test_absent_max_tokens_is_the_engines_to_deduce_and_context_length_is_the_models(trt):
    """TensorRT-LLM's LLM.args.max_seq_len is None unless the user sets it; the worker takes the
    model's length and, given max_tokens None, deduces the room left. The adapter reads the
    model's config for the advertised context length and sends None."""
    assert trt.llm.args.max_seq_len is None
    info = await trt.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="fake-model"))
    assert info.max_context_length == fake_trtllm.MODEL_MAX_POSITIONS
    s = await run(trt, gen_request(token_ids=input_pb2.TokenIds(ids=[5] * 250)))
    assert trt.llm.submitted[-1]["sp"].max_tokens is None
    assert len(s.token_ids[0]) == 6 and s.finished[0].reason == g.FINISH_REASON_LENGTH
    # beyond the room: refused before acceptance (TensorRT-LLM would clamp it silently)
    await expect_status(trt.stub.Generate(gen_request(token_ids=input_pb2.TokenIds(ids=[5] * 250),
                                                      stopping=g.StoppingOptions(max_tokens=7))), INVALID, "exceeds")


async def test_no_sampling_knobs_samples_at_temperature_one_and_n_works(trt):
    """Unset temperature/top_p/top_k would be greedy in TensorRT-LLM (params_imply_greedy_decoding),
    which refuses n > 1; the adapter sends temperature 1, top_p 1, top_k 0 as vLLM and
    TensorRT-LLM's own server do."""
    req = gen_request("hi", sampling=g.SamplingParams(num_sequences=2), stopping=g.StoppingOptions(max_tokens=3))
    s = await run(trt, req)
    sp = trt.llm.submitted[-1]["sp"]
    assert (sp.temperature, sp.top_p, sp.top_k, sp.n) == (1.0, 1.0, 0, 2)
    assert set(s.finished) == {0, 1}


async def test_n_greater_than_one_with_stale_diffs(serve):
    async with serve(fake_trtllm.Args(sampler_type="TRTLLMSampler")) as trt:
        req = gen_request("hi", sampling=g.SamplingParams(num_sequences=3, temperature=0.8, seed=1),
                          stopping=g.StoppingOptions(max_tokens=9))
        responses = await collect(trt.stub, req)
        s = check_generate_stream(req, responses)
        for i in range(3):
            assert s.text[i] == expected(9, i, seed=1)
            assert s.token_ids[i] == [ord(c) for c in expected(9, i, seed=1)]
        assert s.usage.completion_tokens == 27


async def test_stale_diffs_really_happen_in_the_fake(tensorrt_llm):
    llm = tensorrt_llm.LLM()
    out = llm.generate_async("hi", tensorrt_llm.SamplingParams(max_tokens=4, n=2, temperature=1.0), streaming=True)
    diffs = []
    async for o in out:
        diffs.append((list(o.outputs[0].token_ids_diff), list(o.outputs[1].token_ids_diff)))
    # after sequence 1 is updated, sequence 0 still reports its previous diff
    assert any(a and b for a, b in diffs)


async def test_greedy_n_rejected_by_engine(trt):
    req = gen_request("hi", sampling=g.SamplingParams(num_sequences=2, temperature=0.0))
    await expect_status(trt.stub.Generate(req), INVALID, "multiple returns")


async def test_stop_text_multi_token_never_leaks(trt):
    req = gen_request("hi", stopping=g.StoppingOptions(max_tokens=40, conditions=[g.StopCondition(stop_text="wor")]))
    responses = await collect(trt.stub, req)
    s = check_generate_stream(req, responses)
    assert s.text[0] == "hello "
    assert s.token_ids[0] == [ord(c) for c in "hello "]
    assert s.finished[0].stop_match.stop_text == "wor"
    streamed = "".join(r.token.text for r in responses if r.HasField("token"))
    assert "w" not in streamed


async def test_stop_text_included(trt):
    req = gen_request("hi", stopping=g.StoppingOptions(max_tokens=40, include_stop_in_output=True,
                                                       conditions=[g.StopCondition(stop_text="wor")]))
    s = await run(trt, req)
    assert s.text[0] == "hello wor"


async def test_stop_token_id_and_eos(trt):
    stop_w = g.StopCondition(stop_token_id=ord("w"))
    req = gen_request("hi", stopping=g.StoppingOptions(max_tokens=40, conditions=[stop_w]))
    s = await run(trt, req)
    assert s.finished[0].stop_match.stop_token_id == ord("w")
    assert s.text[0] == "hello "
    trt.llm.eos_after = 3
    s = await run(trt, gen_request("hi", stopping=g.StoppingOptions(max_tokens=10)))
    assert s.finished[0].stop_match.eos_token_id == fake_trtllm.EOS and s.text[0] == "hel"
    s = await run(trt, gen_request("hi", stopping=g.StoppingOptions(max_tokens=10, ignore_eos=True)))
    assert s.finished[0].reason == g.FINISH_REASON_LENGTH
    s = await run(trt, gen_request("hi", stopping=g.StoppingOptions(max_tokens=10, min_tokens=5)))
    assert len(s.token_ids[0]) == 5


async def test_output_logprobs_top_n(trt):
    req = gen_request("hi", stopping=g.StoppingOptions(max_tokens=4), response=g.ResponseOptions(
        return_output_logprobs=True, output_candidates=g.CandidateTokenSelection(top_n=3)))
    s = await run(trt, req)
    assert trt.llm.submitted[-1]["sp"].logprobs == 3
    for info, tid in zip(s.tokens[0], s.token_ids[0], strict=True):
        assert info.rank == 1 and info.logprob == pytest.approx(fake_trtllm.logprob(1))
        assert [c.token_id for c in info.candidates] == [tid, tid + 1, tid + 2]
    req = gen_request("hi", stopping=g.StoppingOptions(max_tokens=2),
                      response=g.ResponseOptions(return_output_logprobs=True))
    s = await run(trt, req)
    assert all(i.HasField("logprob") and not i.candidates for i in s.tokens[0])


async def test_logprobs_n2_aligned(trt):
    req = gen_request("hi", sampling=g.SamplingParams(num_sequences=2, temperature=1.0),
                      stopping=g.StoppingOptions(max_tokens=6), response=g.ResponseOptions(
                          return_output_logprobs=True, output_candidates=g.CandidateTokenSelection(top_n=1)))
    s = await run(trt, req)
    for i in range(2):
        assert [c.candidates[0].token_id for c in s.tokens[i]] == s.token_ids[i]


async def test_prompt_logprobs(trt):
    req = gen_request(token_ids=input_pb2.TokenIds(ids=[70, 71, 72, 73]), stopping=g.StoppingOptions(max_tokens=1),
                      response=g.ResponseOptions(return_prompt_logprobs=True,
                                                 prompt_candidates=g.CandidateTokenSelection(top_n=2)))
    s = await run(trt, req)
    assert [t.token_id for t in s.prompt.tokens] == [70, 71, 72, 73]
    assert not s.prompt.tokens[0].HasField("logprob")
    for t in s.prompt.tokens[1:]:
        assert t.rank == 1 and [c.token_id for c in t.candidates] == [t.token_id, t.token_id + 1]
    req = gen_request(token_ids=input_pb2.TokenIds(ids=[70, 71, 72, 73]), stopping=g.StoppingOptions(max_tokens=1),
                      response=g.ResponseOptions(return_prompt_logprobs=True, prompt_logprob_start=2))
    s = await run(trt, req)
    assert [t.token_id for t in s.prompt.tokens] == [72, 73] and s.prompt.tokens[0].HasField("logprob")


@pytest.mark.parametrize("response, fragment", [
    (g.ResponseOptions(return_output_logprobs=True, output_candidates=g.CandidateTokenSelection(
        token_ids=input_pb2.TokenIds(ids=[1]))), "TOKEN_IDS"),
    (g.ResponseOptions(return_output_logprobs=True, output_candidates=g.CandidateTokenSelection(
        all=g.AllCandidates())), "ALL"),
    (g.ResponseOptions(return_prompt_logprobs=True, prompt_candidates=g.CandidateTokenSelection(
        all=g.AllCandidates())), "ALL"),
    (g.ResponseOptions(return_output_logprobs=True, output_candidates=g.CandidateTokenSelection(top_n=21)),
     "max_top_n"),
])
async def test_unadvertised_logprob_modes_rejected(trt, response, fragment):
    await expect_status(trt.stub.Generate(gen_request("hi", response=response)), INVALID, fragment)


async def test_priority_and_bypass_rejected_cache_salt_passed(trt):
    await expect_status(trt.stub.Generate(gen_request("hi", priority=1)), INVALID, "priority")
    await expect_status(trt.stub.Generate(gen_request("hi", kv=g.KvOptions(bypass_prefix_cache=True))), INVALID,
                        "bypass")
    req = gen_request("abcdefgh", stopping=g.StoppingOptions(max_tokens=1), kv=g.KvOptions(cache_salt="s1"))
    await run(trt, req)
    assert trt.llm.submitted[-1]["salt"] == "s1"
    s = await run(trt, req)
    assert s.usage.cached_prompt_tokens == 8
    other = gen_request("abcdefgh", stopping=g.StoppingOptions(max_tokens=1), kv=g.KvOptions(cache_salt="s2"))
    assert (await run(trt, other)).usage.cached_prompt_tokens == 0


KNOBS = dict(min_p=0.1, frequency_penalty=0.2, presence_penalty=0.3, repetition_penalty=1.1, seed=4)


async def test_sampling_options_reach_engine_under_the_trtllm_sampler(serve):
    async with serve(fake_trtllm.Args(sampler_type="TRTLLMSampler")) as trt:
        req = gen_request("hi", sampling=g.SamplingParams(temperature=0.5, top_p=0.9, top_k=-1, **KNOBS),
                          stopping=g.StoppingOptions(max_tokens=2, min_tokens=1))
        s = await run(trt, req)
        sp = trt.llm.submitted[-1]["sp"]
        assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed, sp.min_tokens) == (0.5, 0.9, 0, 0.1, 4, 1)
        assert (sp.frequency_penalty, sp.presence_penalty, sp.repetition_penalty) == (0.2, 0.3, 1.1)
        assert s.text[0] == expected(2, seed=4, shift=1)  # honoured: the seed and the penalty move the text


@pytest.mark.parametrize("name", sorted(KNOBS))
async def test_default_sampler_refuses_the_knobs_it_ignores(trt, name):
    """TensorRT-LLM 1.2's default TorchSampler accepts these and ignores them (the fake does too:
    the text would not move); the adapter refuses them before acceptance, naming the field.
    No-op values (penalty 1.0 / 0, min_p 0) pass."""
    req = gen_request("hi", sampling=g.SamplingParams(**{name: KNOBS[name]}), stopping=g.StoppingOptions(max_tokens=2))
    await expect_status(trt.stub.Generate(req), INVALID, f"sampling.{name}", "TRTLLMSampler")
    if name != "seed":
        neutral = {"repetition_penalty": 1.0}.get(name, 0.0)
        await run(trt, gen_request("hi", sampling=g.SamplingParams(**{name: neutral}),
                                   stopping=g.StoppingOptions(max_tokens=2)))


async def test_the_default_sampler_really_ignores_the_knobs(tensorrt_llm):
    llm = tensorrt_llm.LLM()
    plain = await llm.generate_async("hi", tensorrt_llm.SamplingParams(max_tokens=4, temperature=1.0))
    knobs = await llm.generate_async("hi", tensorrt_llm.SamplingParams(max_tokens=4, temperature=1.0, **KNOBS))
    assert plain.outputs[0].token_ids == knobs.outputs[0].token_ids


STRUCTURAL_TAG = json.dumps({"type": "structural_tag", "triggers": ["<n>"],
                             "structures": [{"begin": "<n>", "schema": {"type": "integer"}, "end": "</n>"}]})


@pytest.mark.parametrize("guide, kw, text", [
    (g.GuidedDecoding(json_schema='{"properties": {"n": {"type": "integer", "minimum": 3}}, "required": ["n"]}'),
     {"json": '{"properties": {"n": {"type": "integer", "minimum": 3}}, "required": ["n"]}'}, '{"n": 3}'),
    (g.GuidedDecoding(regex="a+[0-9]"), {"regex": "a+[0-9]"}, "a0"),
    (g.GuidedDecoding(ebnf_grammar='root ::= "x" digit\ndigit ::= [1-9]'),
     {"grammar": 'root ::= "x" digit\ndigit ::= [1-9]'}, "x1"),
    (g.GuidedDecoding(choice=g.ChoiceConstraint(choices=["a.b", "c"])), {"regex": r"(a\.b|c)"}, "a.b"),
    (g.GuidedDecoding(json_object=g.JsonObjectConstraint()), {"json_object": True}, "{}"),
])
async def test_guided_output_is_constrained(trt, guide, kw, text):
    """The constraint reaches the engine as GuidedDecodingParams and the output satisfies it,
    ending with EOS once complete (choice is an escaped regex: ``.`` matches only itself)."""
    s = await run(trt, gen_request("hi", guided=guide, stopping=g.StoppingOptions(max_tokens=20)))
    gd = trt.llm.submitted[-1]["sp"].guided_decoding
    for k, v in kw.items():
        assert getattr(gd, k) == v
    assert s.text[0] == text and s.finished[0].reason == g.FINISH_REASON_STOP
    assert s.finished[0].stop_match.eos_token_id == fake_trtllm.EOS


async def test_guided_structural_tag_leaves_free_text_free(trt):
    req = gen_request("hi", guided=g.GuidedDecoding(structural_tag=STRUCTURAL_TAG),
                      stopping=g.StoppingOptions(max_tokens=5))
    s = await run(trt, req)
    assert trt.llm.submitted[-1]["sp"].guided_decoding.structural_tag == STRUCTURAL_TAG
    assert s.text[0] == expected(5) and s.finished[0].reason == g.FINISH_REASON_LENGTH


@pytest.mark.parametrize("guide, fragment", [
    (g.GuidedDecoding(regex="(a"), "invalid regex"),
    (g.GuidedDecoding(ebnf_grammar='start ::= "a"'), "no `root` rule"),
    (g.GuidedDecoding(structural_tag='{"a": 1}'), "invalid structural tag"),
])
async def test_invalid_guide_is_refused_at_the_engines_first_response(trt, guide, fragment):
    """TensorRT-LLM compiles the grammar in the engine; its refusal is the stream's first item, a
    RequestError, which the adapter (accepting on the first response) refuses as INVALID_ARGUMENT."""
    await expect_status(trt.stub.Generate(gen_request("hi", guided=guide)), INVALID, fragment)


async def test_guided_backend_mismatch_and_disabled(trt, serve):
    await expect_status(trt.stub.Generate(gen_request("hi", guided=g.GuidedDecoding(regex="a", backend="llguidance"))),
                        INVALID, "guided.backend")
    async with serve(fake_trtllm.Args(guided_decoding_backend=None)) as h:
        await expect_status(h.stub.Generate(gen_request("hi", guided=g.GuidedDecoding(regex="a"))), INVALID, "REGEX")


async def test_dp_rank_needs_attention_dp(serve):
    async with serve(fake_trtllm.Args(enable_attention_dp=True, tensor_parallel_size=2)) as h:
        await run(h, gen_request("hi", kv=g.KvOptions(data_parallel_rank=1), stopping=g.StoppingOptions(max_tokens=1)))
        sched = h.llm.submitted[-1]["sched"]
        assert (sched.attention_dp_rank, sched.attention_dp_relax) == (1, False)
        await expect_status(h.stub.Generate(gen_request("hi", kv=g.KvOptions(data_parallel_rank=2))), INVALID)
    async with serve() as h:
        await expect_status(h.stub.Generate(gen_request("hi", kv=g.KvOptions(data_parallel_rank=1))), INVALID)


async def test_media_and_prompt_too_long_rejected(trt):
    req = gen_request("hi", media=[input_pb2.MediaItem(url="http://x/y.png")])
    await expect_status(trt.stub.Generate(req), INVALID, "media")
    await expect_status(trt.stub.Generate(gen_request(token_ids=input_pb2.TokenIds(ids=[5] * 256))), INVALID, "room")


async def _start_slow(trt, rid: str, n: int = 1):
    trt.llm.step_s = 0.01
    req = gen_request("hi", request_id=rid, sampling=g.SamplingParams(num_sequences=n, temperature=1.0),
                      stopping=g.StoppingOptions(max_tokens=200))
    call = trt.stub.Generate(req)
    first = await call.read()
    assert first.HasField("token")
    return req, call, first


async def test_abort_by_id_all_outputs_cancelled(trt):
    req, call, first = await _start_slow(trt, "ab", n=2)
    resp = await trt.stub.Abort(lifecycle_pb2.AbortRequest(request_id="ab"))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    rest = await read_rest(call)
    s = check_generate_stream(req, [first, *rest])
    assert {f.reason for f in s.finished.values()} == {g.FINISH_REASON_CANCELLED}
    assert trt.llm.abort_calls and not trt.llm.live
    again = await trt.stub.Abort(lifecycle_pb2.AbortRequest(request_id="ab"))
    assert again.status == lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED


async def test_abort_all(trt):
    calls = [await _start_slow(trt, f"r{i}") for i in range(2)]
    await trt.stub.Abort(lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests()))
    for req, call, first in calls:
        s = check_generate_stream(req, [first, *await read_rest(call)])
        assert s.finished[0].reason == g.FINISH_REASON_CANCELLED
    assert len(trt.llm.abort_calls) == 2 and not trt.backend._live


async def test_client_cancel_aborts_engine_request(trt):
    req, call, first = await _start_slow(trt, "cx")
    call.cancel()
    await eventually(lambda: not trt.llm.live and not trt.backend._live)
    assert trt.llm.abort_calls


async def test_enqueue_refusal_is_invalid_argument_not_an_engine_error(serve, tmp_path):
    """A LoRA the worker cannot load is refused when it enqueues the request (base_worker.py
    _enqueue_request); behind the proxy that is the stream's first item, a RequestError."""
    args = fake_trtllm.Args(lora_config=fake_trtllm.LoraConfig())
    async with serve(args) as h:
        h.backend._loras["bad"] = fake_trtllm.LoRARequest("bad", 9, str(tmp_path))  # no adapter_config.json
        h.server.service._loras["bad"] = None
        await expect_status(h.stub.Generate(gen_request("hi", lora_name="bad")), INVALID, "cannot load LoRA")
        assert not h.backend._live and not h.backend._lora_in_use


async def test_engine_error_after_acceptance_is_one_engine_error(trt):
    trt.llm.fail_after = 2
    req = gen_request("hi", stopping=g.StoppingOptions(max_tokens=50))
    s = check_generate_stream(req, await collect(trt.stub, req))
    assert s.error is not None and "mid-stream" in s.error.message
    assert not trt.backend._live


async def test_aggregated_probe_runs_one_token(trt):
    resp = await trt.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
    assert resp.state == lifecycle_pb2.HEALTH_STATE_READY
    assert any(c.name == "inference_probe" and c.state == lifecycle_pb2.HEALTH_STATE_READY for c in resp.checks)
    assert trt.llm.submitted[-1]["sp"].max_tokens == 1


async def test_kv_session_on_aggregated_rejected(trt):
    req = gen_request("hi", kv=g.KvOptions(session=kv_pb2.KvSessionRef(session_id="s")))
    await expect_status(trt.stub.Generate(req), grpc.StatusCode.FAILED_PRECONDITION)


async def test_llguidance_offers_no_structural_tag(serve):
    """llguidance has no structural-tag matcher: not advertised, refused before acceptance."""
    async with serve(fake_trtllm.Args(guided_decoding_backend="llguidance")) as h:
        info = await h.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="fake-model"))
        assert model_pb2.GUIDED_DECODING_MODE_STRUCTURAL_TAG not in info.generation.guided_decoding.modes
        assert model_pb2.GUIDED_DECODING_MODE_REGEX in info.generation.guided_decoding.modes
        req = gen_request("hi", guided=g.GuidedDecoding(structural_tag=STRUCTURAL_TAG))
        await expect_status(h.stub.Generate(req), INVALID, "STRUCTURAL_TAG")


async def test_n2_stop_text_every_output_finishes_right_and_text_is_decoded_here(trt):
    """With n > 1 TensorRT-LLM gives a finish reason (and cuts the stop word) only to the sequence
    of the request's final response, and its detokenizer re-appends stale diffs to the others and
    keeps text of stop tokens it truncates. The adapter decodes text itself (detokenize=False) and
    infers the other outputs' stop from their token suffix."""
    req = gen_request("hi", sampling=g.SamplingParams(num_sequences=2),
                      stopping=g.StoppingOptions(max_tokens=40, conditions=[g.StopCondition(stop_text="wor")]))
    s = await run(trt, req)
    assert trt.llm.submitted[-1]["sp"].detokenize is False
    for i in range(2):
        full = expected(40, i)
        assert s.finished[i].reason == g.FINISH_REASON_STOP and s.finished[i].stop_match.stop_text == "wor"
        assert s.text[i] == full[:full.index("wor")], (i, s.text[i])
        assert s.token_ids[i] == [ord(c) for c in s.text[i]]


async def test_the_engine_text_really_is_wrong_with_n2(tensorrt_llm):
    """What the adapter no longer reads: the fake's detokenized text, as TensorRT-LLM's."""
    llm = tensorrt_llm.LLM()
    out = llm.generate_async("hi", tensorrt_llm.SamplingParams(max_tokens=6, n=2, temperature=1.0), streaming=True)
    async for _ in out:
        pass
    assert any(o.text != llm.tokenizer.decode(o.token_ids) for o in out.outputs)
    assert sum(o.finish_reason is not None for o in out.outputs) == 1  # only the final response's sequence


async def test_v0_1_trace_context_reaches_generate_async(trt):
    """traceparent/tracestate of a v0.1.0 call go to LLM.generate_async(trace_headers=...)."""
    from openengine_adapters.v0_1 import generation_pb2 as v01_gen
    from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    inference = v01_grpc.InferenceStub(trt.channel)
    req = v01_gen.GenerateRequest(prompt="hi", stopping=v01_gen.StoppingOptions(max_tokens=1))
    [r async for r in inference.Generate(req, metadata=(("traceparent", parent), ("tracestate", "v=x")), timeout=10)]
    assert trt.llm.submitted[-1]["trace"] == {"traceparent": parent, "tracestate": "v=x"}
    await collect(trt.stub, gen_request("hi", stopping=g.StoppingOptions(max_tokens=1)))
    assert trt.llm.submitted[-1]["trace"] is None


async def test_with_tracing_on_generate_async_gets_our_spans_context(serve, monkeypatch):
    """--otlp-traces-endpoint: trace_headers carry the server's RPC span (the caller's child), so
    TensorRT-LLM's request span hangs under ours (tests/test_tracing.py has the exported chain)."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra")
    from otlp_receiver import otlp_receiver

    from openengine_adapters.v0_1 import generation_pb2 as v01_gen
    from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    trace, caller = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    async with otlp_receiver() as rx, serve(config={"otlp_traces_endpoint": rx.endpoint}) as trt:
        req = v01_gen.GenerateRequest(prompt="hi", stopping=v01_gen.StoppingOptions(max_tokens=1))
        [r async for r in v01_grpc.InferenceStub(trt.channel).Generate(
            req, metadata=(("traceparent", f"00-{trace}-{caller}-01"),), timeout=10)]
        handed = trt.llm.submitted[-1]["trace"]["traceparent"].split("-")
        await eventually(lambda: rx.named("openengine.v1.Inference/Generate"))
        [ours] = rx.named("openengine.v1.Inference/Generate")
        assert (ours.trace_id, ours.parent_span_id) == (trace, caller)
        assert handed[1:3] == [trace, ours.span_id]


async def test_trace_context_where_generate_async_takes_none(serve, monkeypatch):
    """The 1.1-era LLM.generate_async has no trace_headers (llmapi/llm.py, before OpenTelemetry
    tracing): a v0.1.0 call with trace context is served without it, not failed with a TypeError."""
    from openengine_adapters.v0_1 import generation_pb2 as v01_gen
    from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc

    full = fake_trtllm.LLM.generate_async

    def generate_async(self, inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None,
                       streaming=False, kv_cache_retention_config=None, disaggregated_params=None,
                       _postproc_params=None, scheduling_params=None, cache_salt=None):
        return full(self, inputs, sampling_params, lora_request, prompt_adapter_request, streaming,
                    kv_cache_retention_config, disaggregated_params, _postproc_params, scheduling_params, cache_salt)

    monkeypatch.setattr(fake_trtllm.LLM, "generate_async", generate_async)
    async with serve() as h:
        req = v01_gen.GenerateRequest(prompt="hi", stopping=v01_gen.StoppingOptions(max_tokens=2))
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        out = [r async for r in v01_grpc.InferenceStub(h.channel).Generate(
            req, metadata=(("traceparent", parent),), timeout=10)]
        assert out and h.llm.submitted[-1]["trace"] is None


async def test_prompt_beyond_max_num_tokens_is_invalid(serve):
    """Without chunked prefill the PyTorch LLM refuses a prompt longer than max_num_tokens
    (llmapi/llm.py _check_arguments raises ValueError from generate_async)."""
    async with serve(fake_trtllm.Args(max_num_tokens=8)) as h:
        await expect_status(h.stub.Generate(gen_request("a prompt of twenty..", stopping=g.StoppingOptions(
            max_tokens=1))), grpc.StatusCode.INVALID_ARGUMENT, "max_num_tokens (8)")
        await collect(h.stub, gen_request("short", stopping=g.StoppingOptions(max_tokens=1)))
