"""The requests of issue 24's six failures, as Dynamo's sidecars really send them, and the accepting
behaviour the issue asks for (served, read to its terminal by the client's own strict reader).

Sources: ai-dynamo/dynamo lib/sidecar/openengine/src/convert.rs at 3770f0cf01e66ccbaf076f1b6f3ed8c72061762f
(``generate_metadata`` sends ``openengine-priority`` whenever the router has a priority;
``build_generate_request`` sends the user's logprobs on the prefill leg and a present
``bypass_prefix_cache`` whatever its value); lib/sidecar/trtllm/src/convert.rs at
11db6893d5e47019acb007796daf015e74eb1bda (logprobs and guided on the prefill leg on purpose: "the
context phase produces the first generated token, and its logprob only reaches the decode worker
if the context request computed it"; repetition_penalty and seed forwarded when the user set them)
and disagg.rs at 1d54a636193d71d6a0be29f77899a1d5244c3b20 (``request_extra``: a decode worker's
request that skipped prefill carries no ``kv``); the KV-event source reader is
lib/sidecar/openengine/src/kv.rs ``discover_sources`` at 0cc34d9904da51f01556efab36eb268395d0ef81; the
load reader is lib/sidecar/openengine/src/engine.rs ``is_quiescent`` at
122b2d4417544baca9afc2a18bcfe1b6a6b7458d (``running_requests == 0`` means quiescent), as TensorRT-LLM's
server counts it (tensorrt_llm/grpc/openengine/control.py ``GetLoad`` at
06cb2191b0be3da4297abb13d5082a5e39b3b460: ``running_requests = active_request_count()``).
"""

from __future__ import annotations

import grpc
import pytest
from dynamo_kv import discover_sources
from dynamo_openengine import Preprocessed, ResponseState, build_generate_request, generate_metadata, start_up
from dynamo_trtllm import ResponseState as TrtState
from dynamo_trtllm import build_generate_request as trt_request
from dynamo_trtllm import session_from_json, session_to_json
from replay import PROMPT, new_id, refusal, stream, through_dynamo, wait_idle

from openengine_adapters.v0_1 import kv_pb2, model_pb2, server_pb2


def _model(server, target) -> str:
    return start_up(server.control).remote_model


def _prefill_carries_logprobs(prefill, target, model: str, request) -> bool:
    """Whether this PREFILL engine can carry output logprobs to the decode leg. TensorRT-LLM 1.2
    truly cannot (its handoff has no ``first_gen_log_probs``, which TensorRT-LLM's own OpenEngine
    server uses): there ModelInfo must say so and the request be refused as unsupported, naming the
    field, before acceptance; then False. Every other engine must serve it. A refusal by role
    ("a PREFILL engine emits no output tokens", the reading issue 24 removes) fails either way."""
    info = prefill.control.GetModelInfo(model_pb2.GetModelInfoRequest(model=model), timeout=10)
    if target.engine != "tensorrt_llm" or info.generation.output_logprobs.supported:
        return True
    why = refusal(stream(prefill, request))
    assert why.startswith("INVALID_ARGUMENT") and "response.return_output_logprobs" in why, why
    assert "PREFILL engine emits no output tokens" not in why, why
    return False


def test_priority_key_on_a_model_without_priority_is_served(target):
    """Failure 1: a router's priority hint goes out as ``openengine-priority`` on every request
    (aggregated and prefill legs), whether or not the model advertises priority."""
    for server in [s for s in target.servers if s.role in ("agg", "prefill")]:
        disc = start_up(server.control)
        r = Preprocessed(PROMPT, temperature=0.0, max_tokens=3, priority=5)
        rid = new_id()
        md = generate_metadata(r, disc.mode)
        assert ("openengine-priority", "5") in md
        outs = ResponseState(disc.mode, len(PROMPT)).read(
            stream(server, build_generate_request(r, rid, disc.remote_model, disc.mode), md), rid)
        assert outs[-1].finish_reason is not None


def test_prefill_leg_with_logprobs_and_decode_honours_them(pd, target):
    """Failure 2 (Dynamo's OpenEngine sidecar): the user's logprobs go out on the prefill leg
    (``return_output_logprobs`` + TopN) and on the decode leg, whose tokens carry them."""
    prefill, decode = pd
    pdisc, ddisc = start_up(prefill.control), start_up(decode.control)
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
    rid = new_id()
    request = build_generate_request(r, rid, pdisc.remote_model, "prefill")
    assert request.response.return_output_logprobs and request.response.output_candidates.top_n == 2
    if not _prefill_carries_logprobs(prefill, target, pdisc.remote_model, request):
        return
    (ready,) = ResponseState("prefill", len(PROMPT)).read(stream(prefill, request, generate_metadata(r, "prefill")),
                                                        rid)
    r.prefill_result = through_dynamo(ready.disaggregated_params)
    if not target.decodes_handoffs:
        return
    rid = new_id()
    outs = ResponseState("decode", len(PROMPT)).read(
        stream(decode, build_generate_request(r, rid, ddisc.remote_model, "decode")), rid)
    lps = [lp for o in outs if o.token_ids for lp in o.log_probs]
    assert len(lps) == 4 and all(lp <= 0 for lp in lps)


def test_trtllm_sidecar_prefill_leg_with_logprobs_and_guided(pd, target):
    """Failure 2 (Dynamo's TensorRT-LLM sidecar): the prefill leg carries logprobs, a JSON-schema
    guide and ``extra.request_type = context_only``; the handoff goes through its strict JSON codec
    and the decode leg repeats the guide and logprobs, every token carrying its logprob."""
    prefill, decode = pd
    if not target.supports_guided:
        pytest.skip(f"{target.name}: no guided decoding")
    model = _model(prefill, target)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=24, logprobs=1, guided_decoding={"json": schema})
    request = trt_request(r, new_id(), model, None, "prefill")
    assert request.guided.json_schema and request.response.return_output_logprobs
    assert dict(request.extra) == {"detokenize": False, "request_type": "context_only"}
    if not _prefill_carries_logprobs(prefill, target, model, request):
        r.logprobs = None  # the same guided request without them, as a user who did not ask
        request = trt_request(r, new_id(), model, None, "prefill")
    (ready,) = TrtState(r, "prefill").read(stream(prefill, request))
    handoff = through_dynamo(ready.disaggregated_params)
    assert session_to_json(session_from_json(handoff)) == handoff
    if not target.decodes_handoffs:
        return
    r.prefill_result = handoff
    outs = TrtState(r, "decode").read(stream(decode, trt_request(r, new_id(), model, None, "decode")))
    assert outs[-1].finish_reason in ("stop", "length") and any(o.token_ids for o in outs)


def test_explicit_false_bypass_prefix_cache_is_served(target):
    """Failure 3: ``extra_args.bypass_prefix_cache = false`` goes out as a present ``false``: it asks
    for what every engine does anyway."""
    for server in [s for s in target.servers if s.role in ("agg", "prefill")]:
        disc = start_up(server.control)
        r = Preprocessed(PROMPT, temperature=0.0, max_tokens=2, extra_args={"bypass_prefix_cache": False})
        rid = new_id()
        request = build_generate_request(r, rid, disc.remote_model, disc.mode)
        assert request.kv.HasField("bypass_prefix_cache") and not request.kv.bypass_prefix_cache
        outs = ResponseState(disc.mode, len(PROMPT)).read(stream(server, request), rid)
        assert outs[-1].finish_reason is not None


@pytest.mark.parametrize("option", ["seed", "repetition_penalty"])
def test_options_an_engine_would_ignore_are_served(agg, option):
    """Failure 4: a seed or a repetition penalty the user set is forwarded as set; a deployment
    serving Dynamo (``--ignored-options ignore``, conftest.dynamo_flags) serves it, and an engine
    that would not apply it counts and logs that (issue 24)."""
    disc = start_up(agg.control)
    r = Preprocessed(PROMPT, temperature=0.8, max_tokens=3, **{option: 7 if option == "seed" else 1.1})
    rid = new_id()
    call = stream(agg, build_generate_request(r, rid, disc.remote_model, "aggregated"))
    assert not (why := refusal(call)), why


def test_kv_event_sources_list_our_grpc_stream(target):
    """Failure 5: ``discover_sources`` (Dynamo's reader of GetKvEventSources) on every server whose
    ``SubscribeKvEvents`` works must find a usable ``grpc``/``protobuf`` source for each rank."""
    for server in target.servers:
        call = server.control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(), timeout=2)
        try:
            next(call)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue  # no typed KV stream here: nothing to advertise
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc  # subscribed, no event yet
        finally:
            call.cancel()
        info = server.control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=10)
        sources = discover_sources(server.control, info)
        assert any(s["transport"] == "grpc" for s in sources), sources


def test_decode_without_a_session_is_served(pd, target):
    """Failure 6: conditional disaggregation: the router sends a short prompt straight to a decode
    worker, whose request (disagg.rs ``request_extra`` without context_only) carries no KV session."""
    _, decode = pd
    model = _model(decode, target)
    r = Preprocessed(PROMPT[:8], temperature=0.0, max_tokens=3)
    request = trt_request(r, new_id(), model, None, "aggregated")
    assert not request.HasField("kv") and dict(request.extra) == {"detokenize": False}
    outs = TrtState(r, "decode").read(stream(decode, request))
    assert outs[-1].finish_reason in ("stop", "length") and any(o.token_ids for o in outs)


def test_getload_counts_a_request_in_flight(agg, target):
    """Issue 24 (item 3, SGLang): while a request streams, GetLoad(include_per_rank=false) must not
    say ``running_requests = 0``: Dynamo's ``is_quiescent`` would take the worker for idle."""
    disc = start_up(agg.control)
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=target.slow_tokens, ignore_eos=True)
    rid = new_id()
    call = stream(agg, build_generate_request(r, rid, disc.remote_model, "aggregated"))
    state = ResponseState("aggregated", len(PROMPT))
    while not (out := state.convert(next(call), rid)) or not out.token_ids:
        pass
    load = agg.control.GetLoad(server_pb2.GetLoadRequest(include_per_rank=False), timeout=10)
    call.cancel()
    assert load.HasField("running_requests") and load.running_requests >= 1, load
    wait_idle(agg)
