"""Property tests over the request input space: validation never crashes, and whatever it
accepts streams within the contract; whatever it refuses is refused before any event."""

from __future__ import annotations

import math

import grpc
from fake_backend import default_card
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_contract import check_generate_stream

from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import EngineRole
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, kv_pb2
from openengine_adapters.validation.generate import EngineContext, parse_generate

CARD = default_card()
ENGINE = EngineContext(EngineRole.AGGREGATED, 1, {"lora-a": object()})
REJECT_STATUSES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                   grpc.StatusCode.FAILED_PRECONDITION}

floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                   st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0]))
u32 = st.integers(0, 2**32 - 1)
small = st.integers(0, 8)


def optional(strategy):
    return st.one_of(st.none(), strategy)


@st.composite
def requests(draw):
    req = g.GenerateRequest(request_id=draw(st.sampled_from(["", "x"])))
    which = draw(st.sampled_from(["prompt", "ids", "none"]))
    if which == "prompt":
        req.prompt = draw(st.text(max_size=6))
    elif which == "ids":
        req.token_ids.ids.extend(draw(st.lists(st.integers(0, 200), max_size=5)))
    if draw(st.booleans()):
        s = req.sampling
        for name, strat in (("temperature", floats), ("top_p", floats), ("min_p", floats),
                            ("frequency_penalty", floats), ("presence_penalty", floats),
                            ("repetition_penalty", floats), ("top_k", st.integers(-3, 50)),
                            ("seed", st.integers(0, 2**64 - 1)), ("num_sequences", small)):
            value = draw(optional(strat))
            if value is not None:
                setattr(s, name, value)
    if draw(st.booleans()):
        s = req.stopping
        for name, strat in (("max_tokens", st.integers(0, 300)), ("min_tokens", small),
                            ("ignore_eos", st.booleans()), ("include_stop_in_output", st.booleans())):
            value = draw(optional(strat))
            if value is not None:
                setattr(s, name, value)
        for cond in draw(st.lists(st.one_of(st.text(max_size=3), st.integers(0, 200), st.none()),
                                  max_size=3)):
            c = s.conditions.add()
            if isinstance(cond, str):
                c.stop_text = cond
            elif cond is not None:
                c.stop_token_id = cond
    if draw(st.booleans()):
        r = req.response
        for name in ("return_prompt_logprobs", "return_output_logprobs"):
            value = draw(optional(st.booleans()))
            if value is not None:
                setattr(r, name, value)
        for name in ("prompt_candidates", "output_candidates"):
            kind = draw(st.sampled_from(["none", "top_n", "ids", "all", "empty"]))
            sel = getattr(r, name)
            if kind == "top_n":
                sel.top_n = draw(small)
            elif kind == "ids":
                sel.token_ids.ids.extend(draw(st.lists(st.integers(0, 130), max_size=3)))
            elif kind == "all":
                sel.all.SetInParent()
            elif kind == "empty":
                sel.SetInParent()
        start = draw(optional(small))
        if start is not None:
            r.prompt_logprob_start = start
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["choice", "json_object", "regex", "json_schema", "empty"]))
        if kind == "choice":
            req.guided.choice.choices.extend(draw(st.lists(st.text(max_size=3), max_size=3)))
        elif kind == "json_object":
            req.guided.json_object.SetInParent()
        elif kind == "empty":
            req.guided.backend = "x"
        else:
            setattr(req.guided, kind, draw(st.text(max_size=5)))
    if draw(st.booleans()):
        kv = req.kv
        for name, strat in (("data_parallel_rank", small), ("bypass_prefix_cache", st.booleans()),
                            ("cache_salt", st.text(max_size=3))):
            value = draw(optional(strat))
            if value is not None:
                setattr(kv, name, value)
        if draw(st.booleans()):
            kv.session.CopyFrom(kv_pb2.KvSessionRef(session_id=draw(st.text(max_size=2))))
    if draw(st.booleans()):
        req.media.append(input_pb2.MediaItem(url="http://x/y.png"))
    priority = draw(optional(st.integers(-5, 5)))
    if priority is not None:
        req.priority = priority
    req.lora_name = draw(st.sampled_from(["", "", "lora-a", "missing"]))
    req.model = draw(st.sampled_from(["", "", "tiny", "tiny-alias", "unknown"]))
    return req


@settings(max_examples=600, deadline=None)
@given(requests())
def test_validation_rejects_cleanly_or_produces_consistent_params(req):
    try:
        card = CARD if req.model in ("", "tiny", "tiny-alias") else None
        if card is None:
            return
        params = parse_generate(req, "rid", card, ENGINE)
    except RequestRejected as r:
        assert r.status in REJECT_STATUSES and r.message
        field = r.message.split(":")[0]
        assert field and " " not in field.strip(), f"message should start with the field: {r.message}"
        return
    s = params.sampling
    for value in (s.temperature, s.top_p, s.min_p, s.frequency_penalty, s.presence_penalty,
                  s.repetition_penalty):
        assert value is None or math.isfinite(value)
    assert 1 <= s.num_sequences <= CARD.generation.max_num_sequences
    assert (params.prompt is None) != (params.token_ids is None)
    if params.stopping.max_tokens is not None:
        assert 0 < params.stopping.max_tokens <= CARD.max_output_tokens
    assert not params.media and params.kv_session is None
    assert params.lora_name in ("", "lora-a")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests())
async def test_every_request_is_refused_before_events_or_streams_within_contract(oe, req):
    req.metadata["fake.step_delay_ms"] = "0"
    req.lora_name = ""
    responses = []
    try:
        async for r in oe.stub.Generate(req, timeout=10):
            responses.append(r)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() in REJECT_STATUSES, exc.details()
        assert not responses
        return
    check_generate_stream(req, responses)
