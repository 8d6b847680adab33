"""Dynamo's TensorRT-LLM sidecar (an OpenEngine client) against our servers, replayed from its source.

Client: ai-dynamo/dynamo lib/sidecar/trtllm/src/{convert,client,engine}.rs at
11db6893d5e47019acb007796daf015e74eb1bda, disagg.rs at 1d54a636193d71d6a0be29f77899a1d5244c3b20, and its
Kubernetes probes (lib/sidecar/trtllm/deploy/agg.yaml at 11db6893...); tests/interop/dynamo_trtllm.py
mirrors them. The sidecar speaks to TensorRT-LLM servers, so its requests go to our TensorRT-LLM
adapter; the probe and Abort outcomes it relies on are checked on every server.
"""

from __future__ import annotations

import json
import time

import pytest
from dynamo_openengine import Preprocessed
from dynamo_trtllm import ResponseState, abort_ok, build_generate_request, probe, start_up
from replay import PROMPT, new_id, stream, wait_idle

from openengine_adapters.v0_1 import lifecycle_pb2 as life


@pytest.fixture
def trt(agg, target):  # noqa: D401
    if target.engine != "tensorrt_llm":
        pytest.skip("Dynamo's TensorRT-LLM sidecar serves TensorRT-LLM engines")
    return agg


def test_kubernetes_health_probe_within_its_3s_deadline(target):
    """deploy/agg.yaml: ``ControlStub.Health(HealthRequest(), timeout=3)``, exit 0 iff READY, as the
    startup and readiness probes of every server (prefill and decode too)."""
    for server in target.servers:
        start = time.monotonic()
        assert probe(server.control), server.target
        assert time.monotonic() - start < 3.0


def test_startup_and_a_request_with_derived_max_tokens(trt, target):
    """engine.rs ``start``: GetModelInfo(model=<--model-path>) must report ``max_context_length``;
    a request without max_tokens is sent with ``max(1, context - prompt)`` (convert.rs ``max_tokens``),
    ``num_sequences`` 1, ``return_output_logprobs`` false, ``extra.detokenize`` false, and read
    strictly to its terminal with the server's usage."""
    context = start_up(trt.control, target.model_path)
    r = Preprocessed(PROMPT, temperature=0.0)
    request = build_generate_request(r, new_id(), target.model_path, context, "aggregated")
    assert request.stopping.max_tokens == context - len(PROMPT)
    assert request.response.HasField("return_output_logprobs") and not request.response.return_output_logprobs
    assert dict(request.extra) == {"detokenize": False}
    outs = ResponseState(r, "aggregated").read(stream(trt, request))
    tokens = sum(len(o.token_ids) for o in outs)
    assert tokens >= 1 and outs[-1].usage == (len(PROMPT), tokens)


def test_logprobs_zero_is_sent_as_top1_and_every_token_has_its_logprob(trt, target):
    """convert.rs ``output_candidates``: ``logprobs=0`` goes out as TopN(1); ``map_logprobs`` then
    requires the selected-token logprob on every streamed token."""
    context = start_up(trt.control, target.model_path)
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=5, logprobs=0)
    request = build_generate_request(r, new_id(), target.model_path, context, "aggregated")
    assert request.response.output_candidates.top_n == 1
    outs = ResponseState(r, "aggregated").read(stream(trt, request))
    assert all(o.log_probs for o in outs if o.token_ids)


def test_guided_json_schema_as_rendered(trt, target):
    """convert.rs ``guided_decoding``: a JSON-schema value rendered to its JSON text, backend empty."""
    context = start_up(trt.control, target.model_path)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=40, guided_decoding={"json": schema})
    request = build_generate_request(r, new_id(), target.model_path, context, "aggregated")
    assert json.loads(request.guided.json_schema) == schema and request.guided.backend == ""
    outs = ResponseState(r, "aggregated").read(stream(trt, request))
    assert outs[-1].finish_reason in ("stop", "length")


def test_abort_outcomes_the_client_accepts(agg, target):
    """client.rs ``abort`` (called when Dynamo's request context is stopped): Abort(request_id) must
    answer ABORTED or ALREADY_FINISHED. Mid-stream it is ABORTED and the engine request ends; on a
    request that has just finished, the answer must still be one of the two (not NOT_FOUND: the
    client would log a failed abort). Which of the two is racy just after the terminal: the
    TensorRT-LLM adapter has answered ABORTED there."""
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=target.slow_tokens, ignore_eos=True)
    rid = new_id()
    request = build_generate_request(r, rid, target.model_path if target.engine == "tensorrt_llm" else
                                     agg.control.GetServerInfo(_info(), timeout=10).supported_models[0],
                                     None, "aggregated")
    call = stream(agg, request)
    next(call)  # the request is running
    ack = agg.control.Abort(life.AbortRequest(request_id=rid), timeout=30)
    abort_ok(ack)
    assert ack.status == life.ABORT_STATUS_ABORTED, ack
    call.cancel()
    wait_idle(agg)
    # a request that completed a moment ago (Dynamo's context stops as the last token is read)
    short = build_generate_request(Preprocessed(PROMPT, temperature=0.0, max_tokens=2), rid2 := new_id(),
                                   request.model, None, "aggregated")
    ResponseState(Preprocessed(PROMPT), "aggregated").read(stream(agg, short))
    abort_ok(agg.control.Abort(life.AbortRequest(request_id=rid2), timeout=30))  # either answer, as the client


def _info():
    from openengine_adapters.v0_1 import server_pb2

    return server_pb2.GetServerInfoRequest()
