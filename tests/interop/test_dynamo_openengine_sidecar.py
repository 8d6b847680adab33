"""Dynamo's engine-neutral OpenEngine sidecar against our servers, replayed from its source.

Client: ai-dynamo/dynamo lib/sidecar/openengine/src (engine.rs, convert.rs, client.rs, lib.rs) at
3770f0cf01e66ccbaf076f1b6f3ed8c72061762f, pinned to the v0.1.0 schema; tests/interop/dynamo_openengine.py
mirrors it function by function. Each test drives one of its paths the way the sidecar does and
fails where the sidecar would (a ``ClientRefused``).
"""

from __future__ import annotations

import grpc
import pytest
from dynamo_openengine import (
    Discovery,
    Preprocessed,
    ResponseState,
    build_generate_request,
    disagg_json_to_kv_session,
    generate_metadata,
    kv_session_to_disagg_json,
    start_up,
)
from dynamo_trtllm import session_from_json as trt_session_from_json
from dynamo_trtllm import session_to_json as trt_session_to_json
from replay import PROMPT, TRACE, new_id, stream, through_dynamo, wait_idle

from openengine_adapters.v0_1 import kv_pb2, server_pb2

SGLANG_FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's FAKE_BOOTSTRAP_HOST: the fake backend transfers nothing


def run(server, disc: Discovery, r: Preprocessed, mode: str | None = None):
    """engine.rs ``generate``: build, send with the metadata, read strictly to the terminal."""
    mode = mode or disc.mode
    rid = new_id()
    request = build_generate_request(r, rid, disc.remote_model, mode)
    state = ResponseState(mode, len(r.token_ids))
    return request, state.read(stream(server, request, generate_metadata(r, mode)), rid)


def test_startup_discovery_twice_identity_and_capacity(target):
    """``bootstrap_discover`` + ``start``: GetServerInfo twice with the same identity, the exact v0.1.0
    ``schema_release``, exactly one supported model, a role, ``kv_connector`` enabled with a transfer
    backend on prefill/decode roles; the capacity the KV router registers is read and agrees with
    GetLoad."""
    for server in target.servers:
        disc = start_up(server.control)
        assert disc.mode == server.role if server.role != "agg" else disc.mode == "aggregated"
        cfg = disc.engine_config()
        load = server.control.GetLoad(server_pb2.GetLoadRequest(), timeout=10)
        if cfg["total_kv_blocks"] is not None and load.HasField("total_kv_blocks"):
            assert cfg["total_kv_blocks"] == load.total_kv_blocks, (cfg, load)
        if target.engine in ("vllm", "sglang"):  # real engines know their KV layout before serving
            assert cfg["kv_cache_block_size"] and cfg["total_kv_blocks"], cfg
        if cfg["data_parallel_size"] is not None:
            assert cfg["data_parallel_size"] >= 1, cfg


def test_aggregated_request_as_built_and_read_strictly(agg):
    """A chat turn as the frontend preprocesses it: token ids, greedy, hidden EOS stop ids, no
    logprobs (ResponseOptions and KvOptions present and empty), trace headers and the target rank
    in metadata; the strict reader: request id on every response, output_index 0, usage only on
    the terminal with a known finish reason, nothing after it."""
    disc = start_up(agg.control)
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=8, stop_token_ids_hidden=[2], trace=TRACE, dp_rank=0)
    request, outs = run(agg, disc, r)
    assert request.HasField("response") and request.response.ByteSize() == 0
    assert request.HasField("kv") and request.kv.ByteSize() == 0
    tokens = [t for o in outs for t in o.token_ids]
    assert 1 <= len(tokens) <= 8 and outs[-1].finish_reason in ("stop", "length")
    assert outs[-1].usage == (len(PROMPT), len(tokens)), (outs[-1].usage, len(tokens))


@pytest.mark.parametrize("top_n", [0, 2])
def test_logprobs_topn_as_the_sidecar_asks(agg, top_n):
    """``output_options.logprobs = n`` becomes ``return_output_logprobs`` with ``TopN(n)``: TopN(0)
    (the selected token's logprob, no alternatives) must be served, every token carrying it."""
    disc = start_up(agg.control)
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=4, logprobs=top_n)
    request, outs = run(agg, disc, r)
    assert request.response.output_candidates.WhichOneof("selection") == "top_n"
    lps = [lp for o in outs if o.token_ids for lp in o.log_probs]
    assert lps and all(lp <= 0.0 for lp in lps), lps


def test_cache_salt_and_sampling_fields_as_sent(agg):
    """``routing.cache_namespace`` as ``kv.cache_salt``, the sampling fields every engine applies (top_k
    -1 dropped as "all"), stop strings and ids merged and sorted, a min_tokens. (A seed: see
    test_issue24_requests.py, TensorRT-LLM's TorchSampler ignores it.)"""
    disc = start_up(agg.control)
    r = Preprocessed(PROMPT, temperature=0.7, top_p=0.9, top_k=-1, min_p=0.0, frequency_penalty=0.0,
                     presence_penalty=0.0, max_tokens=6, min_tokens=2, stop=["\n\n\n"],
                     stop_token_ids=[3], stop_token_ids_hidden=[2, 3], cache_namespace="tenant-a")
    request, outs = run(agg, disc, r)
    assert request.kv.cache_salt == "tenant-a" and not request.sampling.HasField("top_k")
    assert sum(len(o.token_ids) for o in outs) >= 2


@pytest.mark.parametrize("after_first_token", [False, True], ids=["before-first-token", "after-first-token"])
def test_cancellation_by_dropping_the_stream(agg, target, after_first_token):
    """engine.rs ``generate``: on ``ctx.stopped()`` the sidecar drops the stream (no Abort RPC in
    this version): the engine request must end (GetLoad back to 0) and the server keep serving."""
    disc = start_up(agg.control)
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=target.slow_tokens, ignore_eos=True)
    rid = new_id()
    call = stream(agg, build_generate_request(r, rid, disc.remote_model, "aggregated"),
                  generate_metadata(r, "aggregated"))
    state = ResponseState("aggregated", len(PROMPT))
    if after_first_token:
        while not (out := state.convert(next(call), rid)) or not out.token_ids:
            pass
    call.cancel()
    with pytest.raises(grpc.RpcError) as exc:
        next(call)
    assert exc.value.code() == grpc.StatusCode.CANCELLED
    wait_idle(agg)
    _, outs = run(agg, disc, Preprocessed(PROMPT, temperature=0.0, max_tokens=2))
    assert outs[-1].finish_reason in ("stop", "length")


def test_prefill_decode_through_the_json_handoff(pd, target):
    """The disaggregated path: the prefill leg (max_tokens 1, no session) ends with PrefillReady and
    terminal usage; its KvSessionRef goes through ``kv_session_to_disagg_json``, Dynamo's JSON
    transport and ``disagg_json_to_kv_session`` unchanged (no non-finite number, no integer past
    2^53, no -0.0 in our attributes); the decode leg replays it and is read strictly."""
    prefill, decode = pd
    pdisc, ddisc = start_up(prefill.control), start_up(decode.control)
    assert (pdisc.mode, ddisc.mode) == ("prefill", "decode")
    r = Preprocessed(PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True)
    request, outs = run(prefill, pdisc, r)
    assert request.stopping.max_tokens == 1 and not request.kv.HasField("session")
    (ready,) = outs
    assert ready.usage[0] == len(PROMPT)
    handoff = through_dynamo(ready.disaggregated_params)
    session = disagg_json_to_kv_session(handoff)
    assert kv_session_to_disagg_json(session) == ready.disaggregated_params, "the handoff changed in transit"
    assert trt_session_from_json(through_dynamo(trt_session_to_json(session))) == session  # the strict codec too
    if not target.decodes_handoffs:
        return
    _, douts = run(decode, ddisc, Preprocessed(PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True,
                                               prefill_result=handoff))
    assert sum(len(o.token_ids) for o in douts) == 6 and douts[-1].finish_reason == "length"
    assert douts[-1].usage[0] == len(PROMPT)


def test_decode_leg_of_a_relayed_handoff(target):
    """A DECODE server with no PREFILL server beside it (SGLang on CPU: only its ``fake`` transfer
    backend runs, and only for DECODE): the sidecar's decode leg takes the ``disaggregated_params`` JSON
    of an SGLang prefill's PrefillReady (the KvSessionRef our SGLang PREFILL emits, at SGLang's fake
    bootstrap host: ``sglang/backend.py`` ``_disagg``) after ``kv_session_to_disagg_json`` and Dynamo's
    JSON transport, builds the decode request (``prefill_result`` set, mode ``decode``) and reads the
    stream strictly to its terminal."""
    if target.decode is None or target.prefill is not None:
        pytest.skip(f"{target.name}: the decode leg alone is replayed where no PREFILL server runs")
    decode = target.decode
    ddisc = start_up(decode.control)
    assert ddisc.mode == "decode"
    ref = kv_pb2.KvSessionRef(session_id=new_id(), transfer_backend="fake", dp_rank=0)
    ref.endpoints.add(host=SGLANG_FAKE_BOOTSTRAP_HOST, port=8998, protocol="sglang-bootstrap")
    # a room past 2^53 travels as a decimal string (Struct numbers are doubles; Dynamo's codec refuses them)
    ref.attributes_struct.update({"bootstrap_host": SGLANG_FAKE_BOOTSTRAP_HOST, "bootstrap_port": 8998,
                                  "bootstrap_room": str(2**60 + 7), "prefill_dp_rank": 0})
    handoff = through_dynamo(kv_session_to_disagg_json(ref))
    assert disagg_json_to_kv_session(handoff) == ref, "the handoff changed in transit"
    _, douts = run(decode, ddisc, Preprocessed(PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True,
                                               prefill_result=handoff))
    assert sum(len(o.token_ids) for o in douts) == 6, douts
    assert douts[-1].finish_reason is not None, douts[-1]
    wait_idle(decode)
