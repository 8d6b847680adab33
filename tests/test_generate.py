"""Generate over real gRPC against the fake engine: options, stream contract, rejections."""

from __future__ import annotations

import grpc
import pytest
from fake_backend import EOS_ID, default_card
from helpers import collect, expect_status, gen_request, rejection
from stream_contract import check_generate_stream

from openengine_adapters import backend as be
from openengine_adapters.types import EngineRole, ErrorCode, GuidedMode
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, kv_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def run(oe, req, **kw):
    return check_generate_stream(req, await collect(oe.stub, req), **kw)


async def test_greedy_defaults_and_usage(oe):
    req = gen_request("hi", request_id="greedy")
    s = await run(oe, req)
    assert s.text[0] == "hello world. hel"
    assert s.finished[0].reason == g.FINISH_REASON_LENGTH
    assert (s.usage.prompt_tokens, s.usage.completion_tokens, s.usage.total_tokens) == (2, 16, 18)
    assert s.usage.HasField("cached_prompt_tokens") and s.usage.cached_prompt_tokens == 0
    assert not s.usage.HasField("reasoning_tokens")


async def test_request_id_generated_when_empty(oe):
    responses = await collect(oe.stub, gen_request("hi"))
    ids = {r.request_id for r in responses}
    assert len(ids) == 1 and ids.pop().startswith("oe-")


async def test_presence_not_truthiness_temperature_zero_is_sent(oe):
    req = gen_request("hi", sampling=g.SamplingParams(temperature=0.0, top_k=0))
    await run(oe, req)
    sampling = oe.fake.seen_params[-1].sampling
    assert sampling.temperature == 0.0 and sampling.top_k == 0
    assert sampling.top_p is None and sampling.seed is None


async def test_seeded_sampling_is_reproducible_and_per_index(oe):
    req = gen_request("hi", sampling=g.SamplingParams(temperature=1.0, seed=7, num_sequences=3),
                      stopping=g.StoppingOptions(max_tokens=8))
    a = await run(oe, req)
    b = await run(oe, req)
    assert a.text == b.text
    assert len(set(a.text.values())) == 3  # seed + index differs per output
    assert sorted(a.finished) == [0, 1, 2]
    assert a.usage.completion_tokens == 24


async def test_multiple_outputs_of_one_step_are_separate_messages_in_order(oe):
    req = gen_request("hi", sampling=g.SamplingParams(num_sequences=2),
                      stopping=g.StoppingOptions(max_tokens=3))
    responses = await collect(oe.stub, req)
    kinds = [(r.WhichOneof("event"), getattr(r, r.WhichOneof("event")).output_index) for r in responses]
    assert kinds == [("token", 0), ("token", 1)] * 2 + [("token", 0), ("finished", 0),
                                                        ("token", 1), ("finished", 1)]
    assert [r.HasField("usage") for r in responses].count(True) == 1
    assert responses[-1].HasField("usage")


async def test_stop_text_held_back_and_matched(oe):
    req = gen_request("hi", stopping=g.StoppingOptions(
        max_tokens=40, conditions=[g.StopCondition(stop_text="world")]))
    s = await run(oe, req)
    assert s.text[0] == "hello "
    assert s.finished[0].reason == g.FINISH_REASON_STOP
    assert s.finished[0].stop_match.stop_text == "world"


async def test_stop_text_included_when_asked(oe):
    req = gen_request("hi", stopping=g.StoppingOptions(
        max_tokens=40, conditions=[g.StopCondition(stop_text="world")], include_stop_in_output=True))
    s = await run(oe, req)
    assert s.text[0] == "hello world"


async def test_stop_token_id(oe):
    req = gen_request("hi", stopping=g.StoppingOptions(
        max_tokens=40, conditions=[g.StopCondition(stop_token_id=ord("w"))]))
    s = await run(oe, req)
    assert s.finished[0].stop_match.stop_token_id == ord("w")
    assert s.text[0] == "hello "
    assert s.token_ids[0][-1] == ord("w")


async def test_eos_reported_as_eos_token_and_min_tokens(oe):
    req = gen_request("hi", metadata={"fake.eos_after": "3"})
    s = await run(oe, req)
    assert s.finished[0].stop_match.eos_token_id == EOS_ID
    assert s.token_ids[0][-1] == EOS_ID
    req = gen_request("hi", metadata={"fake.eos_after": "3"},
                      stopping=g.StoppingOptions(min_tokens=6, max_tokens=10))
    s = await run(oe, req)
    assert len(s.token_ids[0]) == 7 and s.finished[0].stop_match.eos_token_id == EOS_ID
    req = gen_request("hi", metadata={"fake.eos_after": "3"},
                      stopping=g.StoppingOptions(ignore_eos=True, max_tokens=10))
    s = await run(oe, req)
    assert s.finished[0].reason == g.FINISH_REASON_LENGTH and len(s.token_ids[0]) == 10


async def test_output_logprobs_top_n_and_token_ids_and_all(oe):
    for sel, count in ((g.CandidateTokenSelection(top_n=3), 3),
                       (g.CandidateTokenSelection(token_ids=input_pb2.TokenIds(ids=[5, 9])), 2),
                       (g.CandidateTokenSelection(all=g.AllCandidates()), 128)):
        req = gen_request("hi", stopping=g.StoppingOptions(max_tokens=2),
                          response=g.ResponseOptions(return_output_logprobs=True, output_candidates=sel))
        s = await run(oe, req)
        for info in s.tokens[0]:
            assert info.HasField("logprob") and len(info.candidates) == count
            assert info.token  # per-token text


async def test_prompt_logprobs_once_first_token_bare(oe):
    req = gen_request("abc", stopping=g.StoppingOptions(max_tokens=2), response=g.ResponseOptions(
        return_prompt_logprobs=True, prompt_candidates=g.CandidateTokenSelection(top_n=2)))
    responses = await collect(oe.stub, req)
    s = check_generate_stream(req, responses)
    assert responses[0].WhichOneof("event") == "prompt"
    assert [t.token_id for t in s.prompt.tokens] == [ord(c) for c in "abc"]
    assert not s.prompt.tokens[0].HasField("logprob")
    assert all(t.HasField("logprob") and len(t.candidates) == 2 for t in s.prompt.tokens[1:])


async def test_prompt_logprob_start(oe):
    req = gen_request(token_ids=input_pb2.TokenIds(ids=[70, 71, 72, 73]), response=g.ResponseOptions(
        return_prompt_logprobs=True, prompt_logprob_start=2), stopping=g.StoppingOptions(max_tokens=1))
    s = await run(oe, req)
    assert [t.token_id for t in s.prompt.tokens] == [72, 73]
    assert all(t.HasField("logprob") for t in s.prompt.tokens)


async def test_prompt_output_not_sent_unless_asked(oe):
    s = await run(oe, gen_request("abc", stopping=g.StoppingOptions(max_tokens=1)))
    assert s.prompt is None


async def test_guided_choice_and_json_object(oe):
    req = gen_request("hi", guided=g.GuidedDecoding(choice=g.ChoiceConstraint(choices=["yes", "no"])))
    s = await run(oe, req)
    assert s.text[0] == "yes"
    s = await run(oe, gen_request("hi", guided=g.GuidedDecoding(json_object=g.JsonObjectConstraint())))
    assert s.text[0] == "{}"


async def test_cache_salt_and_bypass_visible_in_cached_tokens(oe):
    async def cached(**kv):
        s = await run(oe, gen_request("prefix caching", stopping=g.StoppingOptions(max_tokens=1),
                                      kv=g.KvOptions(**kv)))
        return s.usage.cached_prompt_tokens

    assert await cached(cache_salt="a") == 0
    assert await cached(cache_salt="a") == 13
    assert await cached(cache_salt="b") == 0
    assert await cached(cache_salt="a", bypass_prefix_cache=True) == 0


async def test_reasoning_tokens_subset_of_completion(oe):
    s = await run(oe, gen_request("hi", metadata={"fake.reasoning": "4"},
                                  stopping=g.StoppingOptions(max_tokens=6)))
    assert s.usage.reasoning_tokens == 4


async def test_options_reach_the_backend(oe):
    req = gen_request("hi", priority=5, lora_name="", metadata={"k": "v"},
                      kv=g.KvOptions(data_parallel_rank=0),
                      sampling=g.SamplingParams(top_p=0.5, min_p=0.1, frequency_penalty=-1,
                                                presence_penalty=1, repetition_penalty=1.1, top_k=5))
    await run(oe, req)
    p = oe.fake.seen_params[-1]
    assert p.priority == 5 and p.metadata == {"k": "v"} and p.data_parallel_rank == 0
    assert p.model == "tiny"
    assert (p.sampling.top_p, p.sampling.min_p, p.sampling.top_k) == (0.5, 0.1, 5)


async def test_model_by_alias_and_unknown(oe):
    await run(oe, gen_request("hi", model="tiny-alias", stopping=g.StoppingOptions(max_tokens=1)))
    exc = await expect_status(oe.stub.Generate(gen_request("hi", model="nope")),
                              grpc.StatusCode.NOT_FOUND, "model")
    assert rejection(exc).code == ErrorCode.MODEL_NOT_FOUND


async def test_engine_failure_after_acceptance_is_one_terminal_error(oe):
    req = gen_request("hi", metadata={"fake.fail_after": "2"})
    s = await run(oe, req)
    assert s.error.code == ErrorCode.KV_TRANSFER_FAILED
    assert s.error.retryable and s.error.retry_after_ms == 5
    assert s.usage.completion_tokens == 2


async def test_engine_crash_is_internal_error_and_server_survives(oe):
    s = await run(oe, gen_request("hi", metadata={"fake.crash_after": "1"}))
    assert s.error.code == ErrorCode.INTERNAL and not s.error.HasField("retry_after_ms")
    await run(oe, gen_request("hi"))
    assert len(oe.service.registry) == 0 and oe.service.admission.in_flight == 0


class _BrokenBackend:
    """Backends that break the stream contract; the service must turn it into INTERNAL."""

    @staticmethod
    def chunks(kind):
        if kind == "bad_index":
            return [be.GenerationChunk(outputs=[be.OutputDelta(index=3, token_ids=[1])])]
        if kind == "after_finish":
            return [be.GenerationChunk(outputs=[be.OutputDelta(0, [1], "a", finish_reason=1,
                                                               stop=be.StopMatch(eos_token_id=1))]),
                    be.GenerationChunk(outputs=[be.OutputDelta(0, [2], "b")])]
        if kind == "ends_early":
            return [be.GenerationChunk(outputs=[be.OutputDelta(0, [1], "a")])]
        if kind == "stop_without_match":
            return [be.GenerationChunk(outputs=[be.OutputDelta(0, [1], "a", finish_reason=1)])]
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["bad_index", "after_finish", "ends_early", "stop_without_match"])
async def test_backend_contract_violations_become_internal_errors(serve, kind):
    async with serve() as h:
        async def broken(params):
            async def gen():
                for c in _BrokenBackend.chunks(kind):
                    yield c
            return gen()

        h.fake.generate = broken
        n = 2 if kind == "after_finish" else 1  # one output left open, so the stream goes on
        s = await run(h, gen_request("hi", sampling=g.SamplingParams(num_sequences=n)))
        assert s.error.code == ErrorCode.INTERNAL


# ---------------------------------------------------------------- rejections before acceptance

def _card_without_options():
    return default_card(generation=be.GenerationSupport(), supports_lora=False,
                        supports_token_ids_input=False)


REJECTIONS = [
    ("no input", g.GenerateRequest(), "input"),
    ("empty prompt", g.GenerateRequest(prompt=""), "prompt"),
    ("empty token ids", g.GenerateRequest(token_ids=input_pb2.TokenIds()), "token_ids"),
    ("token out of vocab", g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=[500])), "token_ids"),
    ("num_sequences 0", gen_request(sampling=g.SamplingParams(num_sequences=0)), "num_sequences"),
    ("num_sequences over max", gen_request(sampling=g.SamplingParams(num_sequences=5)), "num_sequences"),
    ("negative temperature", gen_request(sampling=g.SamplingParams(temperature=-1)), "temperature"),
    ("nan temperature", gen_request(sampling=g.SamplingParams(temperature=float("nan"))), "temperature"),
    ("top_p zero", gen_request(sampling=g.SamplingParams(top_p=0)), "top_p"),
    ("top_p over one", gen_request(sampling=g.SamplingParams(top_p=1.5)), "top_p"),
    ("top_k below -1", gen_request(sampling=g.SamplingParams(top_k=-2)), "top_k"),
    ("min_p over one", gen_request(sampling=g.SamplingParams(min_p=2)), "min_p"),
    ("frequency penalty", gen_request(sampling=g.SamplingParams(frequency_penalty=3)), "frequency_penalty"),
    ("presence penalty", gen_request(sampling=g.SamplingParams(presence_penalty=-3)), "presence_penalty"),
    ("repetition penalty", gen_request(sampling=g.SamplingParams(repetition_penalty=0)),
     "repetition_penalty"),
    ("max_tokens 0", gen_request(stopping=g.StoppingOptions(max_tokens=0)), "max_tokens"),
    ("max_tokens over max_output", gen_request(stopping=g.StoppingOptions(max_tokens=1000)), "max_tokens"),
    ("min over max", gen_request(stopping=g.StoppingOptions(max_tokens=2, min_tokens=3)), "min_tokens"),
    ("empty stop condition", gen_request(stopping=g.StoppingOptions(conditions=[g.StopCondition()])),
     "conditions[0]"),
    ("empty stop text", gen_request(stopping=g.StoppingOptions(conditions=[g.StopCondition(stop_text="")])),
     "stop_text"),
    ("prompt candidates without logprobs", gen_request(response=g.ResponseOptions(
        prompt_candidates=g.CandidateTokenSelection(top_n=1))), "prompt_candidates"),
    ("output candidates without logprobs", gen_request(response=g.ResponseOptions(
        return_output_logprobs=False, output_candidates=g.CandidateTokenSelection(top_n=1))),
     "output_candidates"),
    ("empty selection", gen_request(response=g.ResponseOptions(
        return_output_logprobs=True, output_candidates=g.CandidateTokenSelection())), "output_candidates"),
    ("top_n over max", gen_request(response=g.ResponseOptions(
        return_output_logprobs=True, output_candidates=g.CandidateTokenSelection(top_n=6))), "max_top_n"),
    ("all not advertised for prompt", gen_request(response=g.ResponseOptions(
        return_prompt_logprobs=True, prompt_candidates=g.CandidateTokenSelection(all=g.AllCandidates()))),
     "ALL"),
    ("duplicate candidate ids", gen_request(response=g.ResponseOptions(
        return_output_logprobs=True,
        output_candidates=g.CandidateTokenSelection(token_ids=input_pb2.TokenIds(ids=[1, 1])))), "duplicate"),
    ("start without prompt logprobs", gen_request(response=g.ResponseOptions(prompt_logprob_start=1)),
     "prompt_logprob_start"),
    ("start beyond prompt", g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=[1, 2]), response=g.ResponseOptions(
        return_prompt_logprobs=True, prompt_logprob_start=2)), "prompt_logprob_start"),
    ("guided without guide", gen_request(guided=g.GuidedDecoding(backend="x")), "guided"),
    ("guided mode not advertised", gen_request(guided=g.GuidedDecoding(regex="a+")), "REGEX"),
    ("empty choices", gen_request(guided=g.GuidedDecoding(choice=g.ChoiceConstraint())), "choices"),
    ("duplicate choices", gen_request(guided=g.GuidedDecoding(choice=g.ChoiceConstraint(choices=["a", "a"]))),
     "choices"),
    ("media not supported", gen_request(media=[input_pb2.MediaItem(url="http://x/y.png")]), "media"),
    ("empty cache salt", gen_request(kv=g.KvOptions(cache_salt="")), "cache_salt"),
    ("dp rank out of range", gen_request(kv=g.KvOptions(data_parallel_rank=1)), "data_parallel_rank"),
]


@pytest.mark.parametrize("name,req,field", REJECTIONS, ids=[r[0] for r in REJECTIONS])
async def test_invalid_requests_rejected_before_acceptance(oe, name, req, field):
    await expect_status(oe.stub.Generate(req), INVALID, field)
    assert len(oe.service.registry) == 0 and oe.service.admission.in_flight == 0


UNADVERTISED = [
    ("token ids input", g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=[1])), "token_ids"),
    ("priority", gen_request(priority=1), "priority"),
    ("lora", gen_request(lora_name="x"), "lora_name"),
    ("cache salt", gen_request(kv=g.KvOptions(cache_salt="s")), "cache_salt"),
    ("bypass false is still explicit", gen_request(kv=g.KvOptions(bypass_prefix_cache=False)),
     "bypass_prefix_cache"),
    ("include stop", gen_request(stopping=g.StoppingOptions(include_stop_in_output=False)),
     "include_stop_in_output"),
    ("prompt logprobs", gen_request(response=g.ResponseOptions(return_prompt_logprobs=True)),
     "return_prompt_logprobs"),
    ("output logprobs", gen_request(response=g.ResponseOptions(return_output_logprobs=True)),
     "return_output_logprobs"),
    ("guided", gen_request(guided=g.GuidedDecoding(json_object=g.JsonObjectConstraint())), "guided"),
    ("n > 1 without max_num_sequences", gen_request(sampling=g.SamplingParams(num_sequences=2)),
     "num_sequences"),
]


@pytest.mark.parametrize("name,req,field", UNADVERTISED, ids=[r[0] for r in UNADVERTISED])
async def test_unadvertised_explicit_options_are_rejected_not_ignored(serve, name, req, field):
    async with serve(None, cards=[_card_without_options()]) as h:
        exc = await expect_status(h.stub.Generate(req), INVALID, field)
        assert rejection(exc).code == ErrorCode.UNSUPPORTED_FEATURE
        assert not h.fake.seen_params


async def test_json_schema_validated_before_acceptance(serve):
    card = default_card(generation=be.GenerationSupport(
        guided_decoding=be.GuidedSupport(True, (GuidedMode.JSON_SCHEMA, GuidedMode.STRUCTURAL_TAG))))
    async with serve(None, cards=[card]) as h:
        await expect_status(h.stub.Generate(gen_request(guided=g.GuidedDecoding(json_schema="{oops"))),
                            INVALID, "json_schema", "JSON")
        await expect_status(h.stub.Generate(gen_request(guided=g.GuidedDecoding(structural_tag="[1]"))),
                            INVALID, "structural_tag")


async def test_media_items_validated(serve):
    async with serve(None, cards=[default_card(supports_multimodal=True)]) as h:
        bad = [input_pb2.MediaItem(), input_pb2.MediaItem(url="ftp://x"),
               input_pb2.MediaItem(data_uri="data:image/png,abc"), input_pb2.MediaItem(raw_bytes=b""),
               input_pb2.MediaItem(modality=9, url="http://x")]
        for item in bad:
            await expect_status(h.stub.Generate(gen_request(media=[item])), INVALID, "media[0]")
        ok = [input_pb2.MediaItem(url="https://x/y.png"),
              input_pb2.MediaItem(data_uri="data:image/png;base64,aGk="),
              input_pb2.MediaItem(raw_bytes=b"\x89PNG", mime_type="image/png", uuid="u1")]
        await run(h, gen_request(media=ok, stopping=g.StoppingOptions(max_tokens=1)))
        media = h.fake.seen_params[-1].media
        assert [m.modality.name for m in media] == ["IMAGE"] * 3  # 0 is treated as image
        assert media[2].raw_bytes == b"\x89PNG" and media[2].uuid == "u1"


async def test_duplicate_live_request_id_rejected(oe):
    req = gen_request("hi", request_id="dup", metadata={"fake.step_delay_ms": "50"})
    first = oe.stub.Generate(req)
    assert (await first.read()).WhichOneof("event") == "token"
    exc = await expect_status(oe.stub.Generate(req), grpc.StatusCode.ALREADY_EXISTS, "dup")
    assert rejection(exc).code == ErrorCode.DUPLICATE_REQUEST
    first.cancel()


# ---------------------------------------------------------------- roles

SESSION = kv_pb2.KvSessionRef(session_id="s1", transfer_backend="fake",
                              endpoints=[kv_pb2.KvEndpoint(host="127.0.0.1", port=7000, protocol="tcp")])


async def test_prefill_returns_terminal_prefill_ready_with_typed_attributes(serve):
    async with serve(None, role=EngineRole.PREFILL) as h:
        req = gen_request("hi", request_id="p1", stopping=g.StoppingOptions(max_tokens=1))
        s = await run(h, req, prefill=True)
        ref = s.prefill_ready.kv_session
        assert ref.session_id == "sess-p1" and ref.transfer_backend == "fake"
        attrs = ref.attributes_struct
        assert attrs["room"] == 42 and attrs["flag"] is True
        assert list(attrs["first_tokens"]) == [1, 2] and attrs["nested"]["engine"] == "fake"
        assert attrs["big"] == "9007199254740993"
        assert s.usage.prompt_tokens == 2 and s.usage.completion_tokens == 0


@pytest.mark.parametrize("req,field", [
    (gen_request(kv=g.KvOptions(session=SESSION)), "kv.session"),
    (gen_request(sampling=g.SamplingParams(num_sequences=2)), "num_sequences"),
    (gen_request(stopping=g.StoppingOptions(max_tokens=5)), "max_tokens"),
    (gen_request(response=g.ResponseOptions(return_output_logprobs=True)), "return_output_logprobs"),
    (gen_request(guided=g.GuidedDecoding(json_object=g.JsonObjectConstraint())), "guided"),
])
async def test_normal_generation_on_prefill_engine_rejected(serve, req, field):
    async with serve(None, role=EngineRole.PREFILL) as h:
        exc = await expect_status(h.stub.Generate(req), grpc.StatusCode.FAILED_PRECONDITION, field)
        assert rejection(exc).code == ErrorCode.ROLE_MISMATCH


async def test_decode_requires_and_validates_session(serve):
    async with serve(None, role=EngineRole.DECODE) as h:
        await expect_status(h.stub.Generate(gen_request()), grpc.StatusCode.FAILED_PRECONDITION, "kv.session")
        bad = [
            (kv_pb2.KvSessionRef(transfer_backend="fake"), "session_id"),
            (kv_pb2.KvSessionRef(session_id="s", transfer_backend="nixl"), "transfer_backend"),
            (kv_pb2.KvSessionRef(session_id="s", endpoints=[kv_pb2.KvEndpoint(host="0.0.0.0", port=1)]),
             "host"),
            (kv_pb2.KvSessionRef(session_id="s", endpoints=[kv_pb2.KvEndpoint(host="h", port=0)]), "port"),
        ]
        for ref, field in bad:
            await expect_status(h.stub.Generate(gen_request(kv=g.KvOptions(session=ref))), INVALID, field)
        exc = await expect_status(h.stub.Generate(gen_request(kv=g.KvOptions(session=SESSION))),
                                  grpc.StatusCode.NOT_FOUND, "session")
        assert rejection(exc).code == ErrorCode.KV_SESSION_NOT_FOUND
        good = kv_pb2.KvSessionRef()
        good.CopyFrom(SESSION)
        good.attributes_struct.update({"room": 42})
        s = await run(h, gen_request(kv=g.KvOptions(session=good), stopping=g.StoppingOptions(max_tokens=2)))
        assert len(s.token_ids[0]) == 2
        assert h.fake.seen_params[-1].kv_session.attributes == {"room": 42}


async def test_aggregated_engine_rejects_session(oe):
    await expect_status(oe.stub.Generate(gen_request(kv=g.KvOptions(session=SESSION))),
                        grpc.StatusCode.FAILED_PRECONDITION, "kv.session")
