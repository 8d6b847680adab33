"""Generate and control on the REAL vLLM engine (CPU, tiny random Llama), checked against an
independent transformers forward pass of the same weights."""

from __future__ import annotations

import asyncio
import json
import re

import grpc
import pytest
import pytest_asyncio
from conftest import engine_args, serve_vllm
from helpers import collect, eventually, expect_status, read_rest, rejection
from stream_contract import check_generate_stream

from openengine_adapters.types import ErrorCode
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, lifecycle_pb2, lora_pb2, model_pb2, scoring_pb2, tasks_pb2
from openengine_adapters.v1 import observability_pb2 as obs

pytestmark = pytest.mark.asyncio(loop_scope="session")
PROMPT = "The cat sat on the mat"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vllm(model_dir):
    from vllm.config import StructuredOutputsConfig

    args = engine_args(model_dir, max_logprobs=-1, enable_prefix_caching=True,
                       structured_outputs_config=StructuredOutputsConfig(backend="xgrammar",
                                                                         disable_any_whitespace=True))
    async with serve_vllm(args) as s:
        yield s


def ids_request(ids, **kw):
    return g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=ids), **kw)


async def run(stub, req):
    return check_generate_stream(req, await collect(stub, req, timeout=60))


def prompt_ids(reference, text=PROMPT):
    return reference.tokenizer(text)["input_ids"]


async def test_greedy_matches_transformers(vllm, reference):
    ids = prompt_ids(reference)
    req = ids_request(ids, sampling=g.SamplingParams(temperature=0.0),
                      stopping=g.StoppingOptions(max_tokens=8, ignore_eos=True))
    s = await run(vllm.stub, req)
    assert s.token_ids[0] == reference.greedy(ids, 8)
    # random weights emit partial UTF-8; vLLM drops the incomplete tail bytes of a finished stream
    assert reference.tokenizer.decode(s.token_ids[0]).startswith(s.text[0]) and s.text[0]
    assert s.usage.prompt_tokens == len(ids) and s.usage.completion_tokens == 8
    assert s.finished[0].reason == g.FINISH_REASON_LENGTH


async def test_explicit_data_parallel_rank_and_metadata_reach_the_engine(vllm):
    req = g.GenerateRequest(prompt=PROMPT, kv=g.KvOptions(data_parallel_rank=0), metadata={"tenant": "a"},
                            stopping=g.StoppingOptions(max_tokens=2, ignore_eos=True))
    s = await run(vllm.stub, req)
    assert len(s.token_ids[0]) == 2
    await expect_status(vllm.stub.Generate(g.GenerateRequest(prompt=PROMPT, kv=g.KvOptions(data_parallel_rank=1))),
                        grpc.StatusCode.INVALID_ARGUMENT, "data_parallel_rank")


async def test_text_prompt_is_tokenized_by_the_engine(vllm, reference):
    s = await run(vllm.stub, g.GenerateRequest(prompt=PROMPT, sampling=g.SamplingParams(temperature=0.0),
                                               stopping=g.StoppingOptions(max_tokens=4, ignore_eos=True)))
    assert s.usage.prompt_tokens == len(prompt_ids(reference))
    assert s.token_ids[0] == reference.greedy(prompt_ids(reference), 4)


async def test_seeded_sampling_reproducible_and_seed_per_index(vllm):
    def req(n, seed):
        return g.GenerateRequest(prompt=PROMPT, sampling=g.SamplingParams(temperature=1.0, seed=seed,
                                                                          num_sequences=n),
                                 stopping=g.StoppingOptions(max_tokens=6, ignore_eos=True))

    a = await run(vllm.stub, req(3, 11))
    b = await run(vllm.stub, req(3, 11))
    assert a.token_ids == b.token_ids and sorted(a.finished) == [0, 1, 2]
    assert len({tuple(v) for v in a.token_ids.values()}) > 1
    single = await run(vllm.stub, req(1, 12))
    assert single.token_ids[0] == a.token_ids[1]  # child i of n uses seed + i
    assert a.usage.completion_tokens == 18


async def test_output_logprobs_equal_log_softmax_with_true_ranks(vllm, reference):
    ids = prompt_ids(reference)
    req = ids_request(ids, sampling=g.SamplingParams(temperature=0.0),
                      stopping=g.StoppingOptions(max_tokens=3, ignore_eos=True),
                      response=g.ResponseOptions(return_output_logprobs=True,
                                                 output_candidates=g.CandidateTokenSelection(top_n=3)))
    s = await run(vllm.stub, req)
    lp = reference.logprobs(ids + s.token_ids[0][:-1])
    for pos, info in enumerate(s.tokens[0]):
        row = lp[len(ids) - 1 + pos]
        assert info.logprob == pytest.approx(float(row[info.token_id]), abs=2e-3)
        assert info.rank == 1 + int((row > row[info.token_id]).sum())
        top = row.topk(3)
        assert [c.token_id for c in info.candidates] == top.indices.tolist()
        assert [c.rank for c in info.candidates] == [1, 2, 3]
        for c, v in zip(info.candidates, top.values.tolist(), strict=True):
            assert c.logprob == pytest.approx(v, abs=2e-3)


async def test_explicit_token_id_candidates_omit_list_positions(vllm, reference):
    ids = prompt_ids(reference)
    wanted = [7, 42, 300]
    req = ids_request(ids, sampling=g.SamplingParams(temperature=0.0),
                      stopping=g.StoppingOptions(max_tokens=2, ignore_eos=True),
                      response=g.ResponseOptions(
                          return_output_logprobs=True,
                          output_candidates=g.CandidateTokenSelection(token_ids=input_pb2.TokenIds(ids=wanted))))
    s = await run(vllm.stub, req)
    lp = reference.logprobs(ids + s.token_ids[0][:-1])
    for pos, info in enumerate(s.tokens[0]):
        row = lp[len(ids) - 1 + pos]
        assert [c.token_id for c in info.candidates] == wanted
        for c in info.candidates:
            assert c.logprob == pytest.approx(float(row[c.token_id]), abs=2e-3)
            assert not c.HasField("rank")  # vLLM reports list positions there, never forwarded


async def test_all_candidates_with_max_logprobs_minus_one(vllm):
    info = await vllm.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    assert model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_ALL in info.generation.output_logprobs.candidate_selection_modes
    req = g.GenerateRequest(prompt=PROMPT, stopping=g.StoppingOptions(max_tokens=1),
                            response=g.ResponseOptions(return_output_logprobs=True,
                                                       output_candidates=g.CandidateTokenSelection(
                                                           all=g.AllCandidates())))
    s = await run(vllm.stub, req)
    vocab = len(s.tokens[0][0].candidates)
    assert vocab == 512


async def test_prompt_logprobs_and_start(vllm, reference):
    ids = prompt_ids(reference)
    lp = reference.logprobs(ids)
    req = ids_request(ids, stopping=g.StoppingOptions(max_tokens=1),
                      response=g.ResponseOptions(return_prompt_logprobs=True,
                                                 prompt_candidates=g.CandidateTokenSelection(top_n=2)))
    s = await run(vllm.stub, req)
    tokens = s.prompt.tokens
    assert [t.token_id for t in tokens] == ids
    assert not tokens[0].HasField("logprob") and not tokens[0].candidates
    for i in range(1, len(ids)):
        assert tokens[i].logprob == pytest.approx(float(lp[i - 1][ids[i]]), abs=2e-3)
        assert len(tokens[i].candidates) == 2
    req = ids_request(ids, stopping=g.StoppingOptions(max_tokens=1),
                      response=g.ResponseOptions(return_prompt_logprobs=True, prompt_logprob_start=2))
    s = await run(vllm.stub, req)
    assert [t.token_id for t in s.prompt.tokens] == ids[2:]
    assert s.prompt.tokens[0].logprob == pytest.approx(float(lp[1][ids[2]]), abs=2e-3)


def clean_stop(tokenizer, greedy):
    """A greedy position k whose token decodes to plain ASCII after a clean prefix."""
    for k in range(1, len(greedy)):
        piece, head = tokenizer.decode(greedy[k:k + 1]), tokenizer.decode(greedy[:k])
        if piece.strip() and piece.isascii() and "\ufffd" not in head and greedy[k] not in greedy[:k]:
            return k, head, piece
    pytest.skip("no clean ASCII token in the greedy continuation")


async def test_stop_text_and_stop_token_with_exact_match(vllm, reference):
    ids = prompt_ids(reference)
    greedy = reference.greedy(ids, 12)
    k, head, piece = clean_stop(reference.tokenizer, greedy)
    base = dict(sampling=g.SamplingParams(temperature=0.0))
    s = await run(vllm.stub, ids_request(ids, stopping=g.StoppingOptions(
        max_tokens=12, ignore_eos=True, conditions=[g.StopCondition(stop_token_id=greedy[k])]), **base))
    assert s.finished[0].stop_match.stop_token_id == greedy[k]
    assert s.token_ids[0] == greedy[:k + 1]  # the stop token is in the token ids, not in the text
    assert s.text[0] == head
    s = await run(vllm.stub, ids_request(ids, stopping=g.StoppingOptions(
        max_tokens=12, ignore_eos=True, conditions=[g.StopCondition(stop_text=piece)]), **base))
    assert s.finished[0].stop_match.stop_text == piece
    assert s.text[0] == head
    s = await run(vllm.stub, ids_request(ids, stopping=g.StoppingOptions(
        max_tokens=12, ignore_eos=True, include_stop_in_output=True,
        conditions=[g.StopCondition(stop_text=piece)]), **base))
    assert s.text[0] == head + piece


async def test_eos_reported_as_eos_token(vllm, reference):
    req = g.GenerateRequest(prompt=PROMPT, guided=g.GuidedDecoding(choice=g.ChoiceConstraint(choices=["yes"])),
                            stopping=g.StoppingOptions(max_tokens=20))
    s = await run(vllm.stub, req)
    assert s.text[0] == "yes"
    assert s.finished[0].stop_match.eos_token_id == reference.tokenizer.eos_token_id


GUIDES = [
    ("json_schema", g.GuidedDecoding(json_schema=json.dumps({
        "type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"],
        "additionalProperties": False})),
     lambda t: json.loads(t)["color"] in ("red", "blue")),
    ("regex", g.GuidedDecoding(regex="[ab]{3}-[0-9]"), lambda t: re.fullmatch("[ab]{3}-[0-9]", t)),
    ("ebnf", g.GuidedDecoding(ebnf_grammar='root ::= "up" | "down"'), lambda t: t in ("up", "down")),
    ("choice", g.GuidedDecoding(choice=g.ChoiceConstraint(choices=["alpha", "beta"])),
     lambda t: t in ("alpha", "beta")),
    ("json_object", g.GuidedDecoding(json_object=g.JsonObjectConstraint()), None),
    ("structural_tag", g.GuidedDecoding(structural_tag=json.dumps({
        "type": "structural_tag",
        "format": {"type": "const_string", "value": "<tag>ok</tag>"}})),
     lambda t: t == "<tag>ok</tag>"),
]


@pytest.mark.parametrize("name,guide,check", GUIDES, ids=[x[0] for x in GUIDES])
async def test_guided_outputs_satisfy_their_constraint(vllm, name, guide, check):
    req = g.GenerateRequest(prompt=PROMPT, guided=guide, sampling=g.SamplingParams(temperature=0.0),
                            stopping=g.StoppingOptions(max_tokens=60))
    s = await run(vllm.stub, req)
    if check is None:
        # json_object: random weights may not close the object within max_tokens, but every
        # prefix the engine emitted must be the start of a JSON object
        from partial_json_parser import loads as partial_json

        text = s.text[0]
        done = s.finished[0].reason == g.FINISH_REASON_STOP
        assert isinstance(json.loads(text) if done else partial_json(text), dict), text
        return
    assert s.finished[0].reason == g.FINISH_REASON_STOP, s.text[0]
    assert check(s.text[0]), s.text[0]


@pytest.mark.parametrize("guide", [g.GuidedDecoding(regex="(unclosed"),
                                   g.GuidedDecoding(ebnf_grammar="root ::= ( "),
                                   g.GuidedDecoding(json_schema='{"type": "nonsense"}')])
async def test_invalid_grammar_rejected_before_acceptance(vllm, guide):
    await expect_status(vllm.stub.Generate(g.GenerateRequest(prompt=PROMPT, guided=guide)),
                        grpc.StatusCode.INVALID_ARGUMENT)
    assert vllm.engine.get_num_unfinished_requests() == 0


async def test_engine_side_validation_is_invalid_argument(vllm):
    cases = [
        ids_request([600]),  # outside the 512-token vocabulary
        g.GenerateRequest(prompt="word " * 600),  # longer than max_model_len 512
        g.GenerateRequest(prompt=PROMPT, sampling=g.SamplingParams(temperature=0.0, num_sequences=2)),
    ]
    for req in cases:
        await expect_status(vllm.stub.Generate(req), grpc.StatusCode.INVALID_ARGUMENT)
    # engine limits the card holds, refused by the shared validation before acceptance
    other = g.GenerateRequest(prompt=PROMPT, guided=g.GuidedDecoding(regex="[ab]+", backend="outlines"))
    await expect_status(vllm.stub.Generate(other), grpc.StatusCode.INVALID_ARGUMENT,
                        "guided.backend: 'outlines' differs from the engine's grammar backend 'xgrammar'")
    many = g.GenerateRequest(prompt=PROMPT, response=g.ResponseOptions(
        return_output_logprobs=True,
        output_candidates=g.CandidateTokenSelection(token_ids=input_pb2.TokenIds(ids=list(range(129))))))
    await expect_status(vllm.stub.Generate(many), grpc.StatusCode.INVALID_ARGUMENT,
                        "response.output_candidates.token_ids: at most 128 ids")
    assert len(vllm.service.registry) == 0


async def test_cache_salt_and_bypass_visible_in_cached_tokens(vllm, reference):
    long_ids = prompt_ids(reference, " ".join(f"number {i} is here" for i in range(60)))[:300]

    async def cached(**kv):
        s = await run(vllm.stub, ids_request(long_ids, stopping=g.StoppingOptions(max_tokens=1),
                                             kv=g.KvOptions(**kv)))
        return s.usage.cached_prompt_tokens

    assert await cached(cache_salt="alpha") == 0
    assert await cached(cache_salt="alpha") >= 128  # at least one full block reused
    assert await cached(cache_salt="beta") == 0
    assert await cached(cache_salt="alpha", bypass_prefix_cache=True) == 0


def long_request(rid):
    return g.GenerateRequest(request_id=rid, prompt=PROMPT,
                             stopping=g.StoppingOptions(max_tokens=400, ignore_eos=True))


async def test_abort_and_cancel_leave_no_engine_work(vllm):
    call = vllm.stub.Generate(long_request("abort-me"))
    await call.read()
    resp = await vllm.stub.Abort(lifecycle_pb2.AbortRequest(request_id="abort-me"))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    rest = await read_rest(call)
    assert rest[-1].finished.reason == g.FINISH_REASON_CANCELLED
    await eventually(lambda: vllm.engine.get_num_unfinished_requests() == 0)
    call = vllm.stub.Generate(long_request("cancel-me"))
    await call.read()
    call.cancel()
    await eventually(lambda: vllm.engine.get_num_unfinished_requests() == 0 and len(vllm.service.registry) == 0)
    load = await vllm.stub.GetLoad(obs.GetLoadRequest())
    assert load.running_requests == 0 and load.queued_requests == 0


async def test_load_moves_and_runtime_events_flow(vllm):
    events = vllm.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest(
        types=[obs.RUNTIME_EVENT_TYPE_FORWARD_PASS]))
    call = vllm.stub.Generate(long_request("busy"))
    await call.read()
    await asyncio.sleep(0.3)
    load = await vllm.stub.GetLoad(obs.GetLoadRequest(include_per_rank=True))
    assert load.running_requests == 1 and load.total_kv_blocks > 0 and load.used_kv_blocks > 0
    assert load.ranks[0].data_parallel_rank == 0
    generated = []
    while not any(generated):  # the running decode's passes count its tokens (a prefill chunk may not)
        ev = await asyncio.wait_for(events.read(), 10)
        assert ev.runtime_event.type == obs.RUNTIME_EVENT_TYPE_FORWARD_PASS
        generated.append(int(ev.runtime_event.attributes["generated_tokens"]))
        assert len(generated) < 50, generated
    events.cancel()
    call.cancel()
    await eventually(lambda: vllm.engine.get_num_unfinished_requests() == 0)


async def test_health_probe_runs_a_real_inference(vllm):
    resp = await vllm.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
    assert resp.state == lifecycle_pb2.HEALTH_STATE_READY
    probe = next(c for c in resp.checks if c.name == "inference_probe")
    assert probe.state == lifecycle_pb2.HEALTH_STATE_READY and "ok" in probe.message


async def test_label_token_scoring_equals_next_token_log_softmax(vllm, reference):
    labels = [7, 42]
    query, cand = "Is the sky blue?", " Answer:"
    req = scoring_pb2.ScoreRequest(
        context=tasks_pb2.TaskRequestContext(request_id="score-1", model="tiny"),
        groups=[scoring_pb2.ScoreGroup(group_id="g", query=tasks_pb2.TaskInput(item_id="q", text=query),
                                       candidates=[tasks_pb2.TaskInput(item_id="c", text=cand)])],
        options=scoring_pb2.ScoreOptions(label_token_ids=labels))
    resp = await vllm.stub.Score(req)
    assert list(resp.label_token_ids) == labels
    tok = reference.tokenizer
    ids = [tok.bos_token_id, *tok.encode(query, add_special_tokens=False),
           *tok.encode(cand, add_special_tokens=False)]
    row = reference.logprobs(ids)[-1]
    values = resp.groups[0].candidates[0].scores.values
    assert values == pytest.approx([float(row[t]) for t in labels], abs=2e-3)
    req.options.normalization = tasks_pb2.SCORE_NORMALIZATION_SOFTMAX
    resp = await vllm.stub.Score(req)
    assert sum(resp.groups[0].candidates[0].scores.values) == pytest.approx(1.0, abs=1e-5)


async def test_priority_not_advertised_under_fcfs(vllm):
    info = await vllm.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    assert info.generation.HasField("supports_priority") and not info.generation.supports_priority
    exc = await expect_status(vllm.stub.Generate(g.GenerateRequest(prompt=PROMPT, priority=1)),
                              grpc.StatusCode.INVALID_ARGUMENT, "priority")
    assert rejection(exc).code == ErrorCode.UNSUPPORTED_FEATURE


async def test_advertisement_agrees_with_the_manifest(vllm):
    from manifest_check import check_manifest

    info = await vllm.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    met = {"generate.prompt_logprobs.all", "generate.output_logprobs.all", "generate.cache_salt",
           "generate.bypass_prefix_cache", "score.label_tokens"}
    assert check_manifest(info, met) >= 25
    # rejected rows answer with the manifest's status
    from openengine_adapters.v1 import kv_pb2

    await expect_status(vllm.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest()), grpc.StatusCode.UNIMPLEMENTED)
    await expect_status(vllm.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest()), grpc.StatusCode.UNIMPLEMENTED)
    await expect_status(vllm.stub.Generate(g.GenerateRequest(prompt=PROMPT, response=g.ResponseOptions(
        return_prompt_logprobs=True, prompt_candidates=g.CandidateTokenSelection(
            token_ids=input_pb2.TokenIds(ids=[1]))))), grpc.StatusCode.INVALID_ARGUMENT)
    session = kv_pb2.KvSessionRef(session_id="s")
    await expect_status(vllm.stub.Generate(g.GenerateRequest(prompt=PROMPT, kv=g.KvOptions(session=session))),
                        grpc.StatusCode.FAILED_PRECONDITION)
    await expect_status(vllm.stub.LoadLora(lora_pb2.LoadLoraRequest()), grpc.StatusCode.FAILED_PRECONDITION)
