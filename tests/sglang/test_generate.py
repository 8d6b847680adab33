"""Generate on the REAL SGLang engine: deltas, n > 1, stops, logprobs, usage, rejections."""

from __future__ import annotations

import grpc
import pytest
from helpers import collect, eventually, expect_status
from stream_contract import check_generate_stream as check_stream

from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROMPT = "the cat sees the dog"


def req(rid, prompt=PROMPT, max_tokens=8, **kw):
    r = g.GenerateRequest(request_id=rid, model="tiny", prompt=prompt, **kw)
    r.stopping.max_tokens = max_tokens
    return r


def greedy(r, ignore_eos=True):
    r.sampling.temperature = 0.0
    r.stopping.ignore_eos = ignore_eos
    return r


async def run(stub, r):
    responses = await collect(stub, r, timeout=120)
    return responses


def text_and_ids(responses, index=0):
    text, ids = "", []
    for x in responses:
        if x.WhichOneof("event") == "token" and x.token.output_index == index:
            text += x.token.text
            ids += [t.token_id for t in x.token.tokens]
    return text, ids


def finishes(responses):
    return {x.finished.output_index: x.finished for x in responses if x.WhichOneof("event") == "finished"}


async def test_streaming_deltas_match_sglang_cumulative_output(served):
    """Each TokenOutput holds only new tokens; their concatenation equals SGLang's own final output."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    r = greedy(req("deltas", max_tokens=12))
    responses = await run(served.stub, r)
    check_stream(r, responses)
    text, ids = text_and_ids(responses)
    tokens = [x for x in responses if x.WhichOneof("event") == "token"]
    assert len(tokens) >= 2  # streamed, not one final blob
    obj = GenerateReqInput(text=PROMPT, sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
    final = None
    async for out in served.tm.generate_request(obj, None):
        final = out
    assert ids == list(final["output_ids"])
    assert text == final["text"]
    fin = finishes(responses)[0]
    assert fin.reason == g.FINISH_REASON_LENGTH
    usage = responses[-1].usage
    assert usage.completion_tokens == 12 and usage.prompt_tokens == final["meta_info"]["prompt_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + 12
    assert usage.HasField("cached_prompt_tokens") and usage.HasField("reasoning_tokens")


async def test_token_ids_input_and_cached_prompt_tokens(served):
    ids = list(range(10, 40))
    first = g.GenerateRequest(request_id="ids-1", model="tiny", token_ids=input_pb2.TokenIds(ids=ids))
    first.stopping.max_tokens = 2
    await run(served.stub, first)
    again = g.GenerateRequest(request_id="ids-2", model="tiny", token_ids=input_pb2.TokenIds(ids=ids))
    again.stopping.max_tokens = 2
    responses = await run(served.stub, again)
    check_stream(again, responses)
    usage = responses[-1].usage
    assert usage.prompt_tokens == 30
    assert usage.cached_prompt_tokens >= 24  # the radix cache reused whole pages of the same prompt


async def test_num_sequences_are_independent_requests(served):
    """n > 1: one SGLang request per output, indexes 0..n-1 each with one finish; greedy outputs agree."""
    r = greedy(req("n3", max_tokens=6))
    r.sampling.num_sequences = 3
    responses = await run(served.stub, r)
    check_stream(r, responses)
    fins = finishes(responses)
    assert sorted(fins) == [0, 1, 2]
    texts = [text_and_ids(responses, i) for i in range(3)]
    assert texts[0] == texts[1] == texts[2] and len(texts[0][1]) == 6
    assert responses[-1].usage.completion_tokens == 18
    await _wait_idle(served)


async def test_num_sequences_sampled(served):
    r = req("n2s", max_tokens=8)
    r.sampling.temperature = 1.0
    r.stopping.ignore_eos = True
    r.sampling.num_sequences = 2
    responses = await run(served.stub, r)
    check_stream(r, responses)
    assert sorted(finishes(responses)) == [0, 1]


async def _baseline(served, n=16):
    responses = await run(served.stub, greedy(req("base", max_tokens=n)))
    return text_and_ids(responses)


async def test_stop_text_trimmed_and_matched(served):
    text, _ = await _baseline(served)
    stop = text[5:8]
    assert stop and stop not in text[:5 + len(stop) - 1]
    r = greedy(req("stoptext", max_tokens=16))
    r.stopping.conditions.add(stop_text=stop)
    responses = await run(served.stub, r)
    check_stream(r, responses)
    out, _ = text_and_ids(responses)
    fin = finishes(responses)[0]
    assert fin.reason == g.FINISH_REASON_STOP and fin.stop_match.stop_text == stop
    assert out == text[:text.index(stop)]
    # include_stop_in_output keeps it
    r = greedy(req("stoptext-keep", max_tokens=16))
    r.stopping.conditions.add(stop_text=stop)
    r.stopping.include_stop_in_output = True
    responses = await run(served.stub, r)
    out, _ = text_and_ids(responses)
    assert out == text[:text.index(stop) + len(stop)]


async def test_stop_token_id_matched(served):
    _, ids = await _baseline(served)
    tid = ids[3]
    pos = ids.index(tid)
    r = greedy(req("stoptok", max_tokens=16))
    r.stopping.conditions.add(stop_token_id=tid)
    responses = await run(served.stub, r)
    check_stream(r, responses)
    _, out = text_and_ids(responses)
    fin = finishes(responses)[0]
    assert fin.reason == g.FINISH_REASON_STOP
    assert fin.stop_match.WhichOneof("match") == "stop_token_id" and fin.stop_match.stop_token_id == tid
    assert out[:pos] == ids[:pos] and len(out) in (pos, pos + 1)


async def test_eos_stop_match(served):
    """Without ignore_eos a random-weight model may or may not hit EOS; when it stops, the match is EOS."""
    r = req("eos", max_tokens=64)
    r.sampling.temperature = 1.0
    r.sampling.num_sequences = 4
    responses = await run(served.stub, r)
    check_stream(r, responses)
    for fin in finishes(responses).values():
        if fin.reason == g.FINISH_REASON_STOP:
            assert fin.stop_match.eos_token_id == 2


async def test_output_logprobs_top_n_and_token_ids(served):
    r = greedy(req("lp", max_tokens=4))
    r.response.return_output_logprobs = True
    r.response.output_candidates.top_n = 3
    responses = await run(served.stub, r)
    check_stream(r, responses)
    infos = [t for x in responses if x.WhichOneof("event") == "token" for t in x.token.tokens]
    assert len(infos) == 4
    for t in infos:
        assert t.HasField("logprob") and t.logprob <= 0
        assert len(t.candidates) == 3
        assert [c.rank for c in t.candidates] == [1, 2, 3]
        assert t.candidates[0].logprob >= t.candidates[1].logprob >= t.candidates[2].logprob
        assert t.rank == 1 and t.candidates[0].token_id == t.token_id  # greedy picks the top token
        assert t.token  # SGLang's token text
    r = greedy(req("lp-ids", max_tokens=3))
    r.response.return_output_logprobs = True
    r.response.output_candidates.token_ids.ids.extend([5, 6])
    responses = await run(served.stub, r)
    check_stream(r, responses)
    for t in (t for x in responses if x.WhichOneof("event") == "token" for t in x.token.tokens):
        assert [c.token_id for c in t.candidates] == [5, 6]
        assert all(c.logprob < 0 and not c.HasField("rank") for c in t.candidates)


async def test_prompt_logprobs(served):
    r = greedy(req("plp", max_tokens=1))
    r.response.return_prompt_logprobs = True
    r.response.prompt_candidates.top_n = 2
    responses = await run(served.stub, r)
    check_stream(r, responses)
    prompts = [x for x in responses if x.WhichOneof("event") == "prompt"]
    assert len(prompts) == 1
    tokens = prompts[0].prompt.tokens
    assert len(tokens) == responses[-1].usage.prompt_tokens
    assert tokens[0].token_id == 1 and not tokens[0].HasField("logprob") and not tokens[0].candidates
    for t in tokens[1:]:
        assert t.HasField("logprob") and len(t.candidates) == 2
    # from a start position
    r = greedy(req("plp-start", max_tokens=1))
    r.response.return_prompt_logprobs = True
    r.response.prompt_logprob_start = 2
    responses = await run(served.stub, r)
    check_stream(r, responses)
    tokens = [x for x in responses if x.WhichOneof("event") == "prompt"][0].prompt.tokens
    assert len(tokens) == responses[-1].usage.prompt_tokens - 2
    assert all(t.HasField("logprob") for t in tokens)


async def test_rejections_before_acceptance(served):
    """What SGLang refuses, and what the adapter cannot do, is a status with no event."""
    r = req("toolong", max_tokens=2045)  # under max_output_tokens, but prompt + max_tokens > context
    await expect_status(served.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT, "context length")
    r = req("seed")
    r.sampling.seed = 5
    r.sampling.temperature = 1.0
    await expect_status(served.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT, "sampling.seed")
    r = req("bypass")
    r.kv.bypass_prefix_cache = True
    await expect_status(served.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT, "kv.bypass_prefix_cache")
    r = req("guided-backend")
    r.guided.regex = "[ab]+"
    r.guided.backend = "outlines"
    await expect_status(served.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT, "guided.backend")
    r = req("lora", lora_name="nope")
    await expect_status(served.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT, "lora_name")
    r = req("alln")
    r.response.return_output_logprobs = True
    r.response.output_candidates.all.SetInParent()
    await expect_status(served.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT, "output_candidates")
    r = req("topp")
    r.sampling.top_p = 0.0
    await expect_status(served.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT)
    await _wait_idle(served)


async def test_cache_salt_separates_prefix_caches(served):
    """The salt reaches SGLang's radix cache: the same prompt reuses its KV under the same salt,
    and none of it under another (a dropped salt would share it)."""
    ids = list(range(200, 240))

    async def cached(rid: str, salt: str) -> int:
        r = g.GenerateRequest(request_id=rid, model="tiny", token_ids=input_pb2.TokenIds(ids=ids))
        r.stopping.max_tokens = 2
        r.kv.cache_salt = salt
        responses = await run(served.stub, r)
        check_stream(r, responses)
        return responses[-1].usage.cached_prompt_tokens

    await cached("salt-a1", "tenant-a")
    same = await cached("salt-a2", "tenant-a")
    other = await cached("salt-b1", "tenant-b")
    assert same >= 32, same  # whole pages of the same prompt under the same salt
    assert other < same and other == 0, (other, same)


async def _wait_idle(served, timeout=20.0) -> None:
    from conftest import running_requests

    async def idle() -> bool:
        return await running_requests(served.tm) == 0 and not served.backend._live

    await eventually(idle, timeout, 0.1, "SGLang still runs a request, or the adapter still holds one")


@pytest.mark.parametrize("field,value,check", [
    ("regex", "(yes|no)-[0-9]", lambda text: text[:-1] in ("yes-", "no-") and text[-1].isdigit()),
    ("choice", ["red.fox", "blue(cat)"], lambda text: text in ("red.fox", "blue(cat)")),
    ("json_schema", '{"type": "string", "maxLength": 4}', lambda text: isinstance(__import__("json").loads(text), str)),
    ("ebnf_grammar", 'root ::= "a" "b"*', lambda text: text.startswith("a") and set(text[1:]) <= {"b"}),
])
async def test_guided_decoding_with_xgrammar(served, field, value, check):
    """SGLang's xgrammar backend runs on CPU: the output follows the constraint (choice lowered to a
    regex of the escaped literals)."""
    r = greedy(req(f"guided-{field}", max_tokens=24), ignore_eos=False)
    if field == "choice":
        r.guided.choice.choices.extend(value)
    else:
        setattr(r.guided, field, value)
    responses = await run(served.stub, r)
    check_stream(r, responses)
    text, _ = text_and_ids(responses)
    assert finishes(responses)[0].reason == g.FINISH_REASON_STOP, text
    assert check(text), text


async def test_guided_json_object(served):
    r = req("guided-json-object", max_tokens=64)
    r.sampling.temperature = 0.0
    r.guided.json_object.SetInParent()
    responses = await run(served.stub, r)
    check_stream(r, responses)
    text, _ = text_and_ids(responses)
    assert text.lstrip().startswith("{"), text
    if finishes(responses)[0].reason == g.FINISH_REASON_STOP:
        assert isinstance(__import__("json").loads(text), dict)


async def test_priority_accepted(served):
    r = greedy(req("prio", max_tokens=3))
    r.priority = 7
    responses = await run(served.stub, r)
    check_stream(r, responses)
    assert finishes(responses)[0].reason == g.FINISH_REASON_LENGTH
