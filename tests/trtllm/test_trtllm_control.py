"""LoRA registry, score, load, runtime/KV events and disaggregation over gRPC on the fake."""

from __future__ import annotations

import asyncio
import base64
import json

import fake_trtllm
import grpc
import pytest
from google.protobuf import json_format
from helpers import collect, eventually, expect_status, gen_request, read_rest, rejection, serve_backend
from stream_contract import check_generate_stream

from openengine_adapters.types import EngineRole
from openengine_adapters.v1 import (
    engine_pb2,
    error_pb2,
    input_pb2,
    kv_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    observability_pb2,
    scoring_pb2,
    tasks_pb2,
)
from openengine_adapters.v1 import generation_pb2 as g

LORA_ARGS = fake_trtllm.Args(lora_config=fake_trtllm.LoraConfig())


def adapter_dir(tmp_path, name="a", weights=True, config=True):
    d = tmp_path / name
    d.mkdir()
    if config:
        (d / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    if weights:
        (d / "adapter_model.safetensors").write_bytes(b"\0")
    return str(d)


def load(lora_id, name, path):
    return lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(lora_id=lora_id, lora_name=name, source_path=path))


async def test_lora_lazy_registry(serve, tmp_path):
    async with serve(LORA_ARGS) as h:
        path = adapter_dir(tmp_path)
        resp = await h.stub.LoadLora(load(3, "a", path))
        assert not resp.already_loaded and h.llm.lora_loads == []  # nothing read yet
        assert (await h.stub.LoadLora(load(3, "a", path))).already_loaded
        await expect_status(h.stub.LoadLora(load(4, "a", path)), grpc.StatusCode.ALREADY_EXISTS)
        await expect_status(h.stub.LoadLora(load(5, "b", adapter_dir(tmp_path, "nw", weights=False))),
                            grpc.StatusCode.INVALID_ARGUMENT, "no weights")
        await expect_status(h.stub.LoadLora(load(5, "b", adapter_dir(tmp_path, "nc", config=False))),
                            grpc.StatusCode.INVALID_ARGUMENT, "adapter_config.json")
        req = gen_request("hi", lora_name="a", stopping=g.StoppingOptions(max_tokens=3))
        s = check_generate_stream(req, await collect(h.stub, req))
        assert h.llm.lora_loads == [3]  # loaded on first use
        assert s.text[0] == "".join(fake_trtllm.TEXT[(t + 3) % 13] for t in range(3))
        assert h.llm.submitted[-1]["lora"].lora_int_id == 3
        listed = await h.stub.ListLoras(lora_pb2.ListLorasRequest())
        assert [a.lora_name for a in listed.adapters] == ["a"]
        # unload refused while a request uses the adapter
        h.llm.step_s = 0.01
        req = gen_request("hi", lora_name="a", request_id="busy", stopping=g.StoppingOptions(max_tokens=100))
        call = h.stub.Generate(req)
        await call.read()
        await expect_status(h.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="a")),
                            grpc.StatusCode.FAILED_PRECONDITION, "in use")
        await h.stub.Abort(lifecycle_pb2.AbortRequest(request_id="busy"))
        await read_rest(call)
        await h.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="a"))
        await expect_status(h.stub.Generate(gen_request("hi", lora_name="a")), grpc.StatusCode.NOT_FOUND)
        # the id is still cached by the engine for the old directory
        await expect_status(h.stub.LoadLora(load(3, "c", adapter_dir(tmp_path, "c"))),
                            grpc.StatusCode.INVALID_ARGUMENT, "choose a new id")
        await h.stub.LoadLora(load(3, "a", path))  # same id, same path: fine


async def test_lora_disabled(trt, tmp_path):
    await expect_status(trt.stub.LoadLora(load(1, "a", adapter_dir(tmp_path))), grpc.StatusCode.FAILED_PRECONDITION)
    await expect_status(trt.stub.Generate(gen_request("hi", lora_name="a")), grpc.StatusCode.INVALID_ARGUMENT)


def score_request(labels, norm=tasks_pb2.SCORE_NORMALIZATION_NONE, **opts):
    return scoring_pb2.ScoreRequest(
        context=tasks_pb2.TaskRequestContext(request_id="sc", model="fake-model"),
        groups=[scoring_pb2.ScoreGroup(group_id="g", query=tasks_pb2.TaskInput(item_id="q", text="ab"),
                                       candidates=[tasks_pb2.TaskInput(item_id="c0", text="h"),
                                                   tasks_pb2.TaskInput(item_id="c1", token_ids=input_pb2.TokenIds(
                                                       ids=[99]))])],
        options=scoring_pb2.ScoreOptions(label_token_ids=labels, normalization=norm, **opts))


def label_logprob(label: int, emitted: int) -> float:
    """The fake model's next-token log-probability of ``label`` where it emits ``emitted``."""
    return fake_trtllm.logprob((label - emitted) % fake_trtllm.VOCAB + 1)


async def test_score_label_tokens_exact_for_any_label(trt):
    """Scores come from the full next-token distribution: labels far outside any top k (EOS, 5)
    get their exact log-probability, not a refusal."""
    h_ = ord("h")  # the fake's first output token: its favourite next token after every pair
    labels = [h_, h_ + 1, fake_trtllm.EOS, 5]
    resp = await trt.stub.Score(score_request(labels))
    assert list(resp.label_token_ids) == labels
    assert resp.semantics == tasks_pb2.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES
    for c in resp.groups[0].candidates:
        assert list(c.scores.values) == pytest.approx([label_logprob(t, h_) for t in labels])
    sp = trt.llm.submitted[-1]["sp"]
    assert sp.max_tokens == 1 and sp.temperature == 0.0 and sp.return_generation_logits and sp.logprobs is None
    assert [s["inputs"]["prompt_token_ids"] for s in trt.llm.submitted[-2:]] == [[1, 97, 98, 104], [1, 97, 98, 99]]
    resp = await trt.stub.Score(score_request(labels, tasks_pb2.SCORE_NORMALIZATION_SOFTMAX))
    values = list(resp.groups[0].candidates[0].scores.values)
    assert sum(values) == pytest.approx(1.0) and values[0] > values[1] > values[2]


async def test_score_rejects_label_outside_vocabulary_and_instruction(trt):
    await expect_status(trt.stub.Score(score_request([ord("h"), fake_trtllm.VOCAB])), grpc.StatusCode.INVALID_ARGUMENT,
                        f"options.label_token_ids: token {fake_trtllm.VOCAB} is outside the model's vocabulary")
    await expect_status(trt.stub.Score(score_request([ord("h")], instruction="x")), grpc.StatusCode.INVALID_ARGUMENT)


async def test_score_without_generation_logits_is_an_engine_failure(serve):
    async with serve(fake_trtllm.Args(speculative_config={"decoding_type": "MTP"})) as h:
        await expect_status(h.stub.Score(score_request([ord("h")])), grpc.StatusCode.INTERNAL,
                            "no generation logits for group 'g'", "speculative decoding")


async def test_model_info_advertisement(trt):
    info = await trt.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="fake-model"))
    gen = info.generation
    assert list(gen.prompt_logprobs.candidate_selection_modes) == [model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N]
    assert list(gen.output_logprobs.candidate_selection_modes) == [model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N]
    assert not gen.supports_priority and not gen.supports_prefix_cache_bypass and gen.supports_cache_salt
    assert model_pb2.GUIDED_DECODING_MODE_CHOICE in gen.guided_decoding.modes
    assert info.max_context_length == 256 and info.kv_block_size == 4 and not info.supports_lora
    assert info.max_running_requests == 2048 and info.max_batched_tokens == 8192  # llm_args.py defaults
    engine = await trt.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert engine.engine_name == "tensorrt_llm" and engine.engine_version == "1.2.0"
    await expect_status(trt.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest()), grpc.StatusCode.UNIMPLEMENTED)


async def test_load_is_cached_and_zero_when_idle(trt):
    idle = await trt.stub.GetLoad(observability_pb2.GetLoadRequest())
    assert idle.HasField("running_requests") and idle.running_requests == 0
    trt.llm.step_s = 0.01
    req = gen_request("hi", request_id="l", stopping=g.StoppingOptions(max_tokens=100))
    call = trt.stub.Generate(req)
    await call.read()
    await asyncio.sleep(0.1)
    busy = await trt.stub.GetLoad(observability_pb2.GetLoadRequest(include_per_rank=True))
    assert busy.running_requests == 1 and busy.total_kv_blocks == 128 and busy.used_kv_blocks == 4
    assert len(busy.ranks) == 1
    # the engine queue drains on read: a second read still answers from the cache
    again = await trt.stub.GetLoad(observability_pb2.GetLoadRequest())
    assert again.running_requests == 1
    await trt.stub.Abort(lifecycle_pb2.AbortRequest(request_id="l"))
    await read_rest(call)
    after = await trt.stub.GetLoad(observability_pb2.GetLoadRequest())
    assert after.running_requests == 0 and after.queued_requests == 0 and after.total_kv_blocks == 128


async def test_load_from_stats_as_json_strings(trt):
    """result.py IterationResult.__anext__ returns json.loads(data): dicts, as the fake gives them;
    LLM.get_stats's docstring still shows JSON strings. The adapter reads either."""
    put = trt.llm.stats_queue.put
    trt.llm.stats_queue.put = lambda item: put(json.dumps(item))
    trt.llm.step_s = 0.01
    call = trt.stub.Generate(gen_request("hi", request_id="s", stopping=g.StoppingOptions(max_tokens=100)))
    await call.read()
    await asyncio.sleep(0.1)
    busy = await trt.stub.GetLoad(observability_pb2.GetLoadRequest())
    assert busy.running_requests == 1 and busy.used_kv_blocks == 4 and busy.total_kv_blocks == 128
    await trt.stub.Abort(lifecycle_pb2.AbortRequest(request_id="s"))
    await read_rest(call)


async def test_load_with_attention_dp_is_not_rank_0_passed_off_as_the_engine(serve):
    """TensorRT-LLM 1.2 forwards iteration stats from attention-DP rank 0 only: GetLoad reports them
    as rank 0's, counts the engine's requests itself, and leaves the other ranks' unknowns unset."""
    async with serve(fake_trtllm.Args(enable_attention_dp=True, tensor_parallel_size=2)) as h:
        h.llm.step_s = 0.01
        calls = []
        for rank in (0, 1):
            calls.append(h.stub.Generate(gen_request("hi", request_id=f"r{rank}",
                                                     kv=g.KvOptions(data_parallel_rank=rank),
                                                     stopping=g.StoppingOptions(max_tokens=100))))
            await calls[-1].read()
        assert sorted(h.llm.rank_of[r["id"]] for r in h.llm.submitted) == [0, 1]
        await asyncio.sleep(0.1)
        load = await h.stub.GetLoad(observability_pb2.GetLoadRequest(include_per_rank=True))
        assert load.running_requests == 2  # both ranks' requests, not rank 0's one
        assert not load.HasField("used_kv_blocks") and not load.HasField("total_kv_blocks")
        assert not load.HasField("queued_requests")
        (rank0,) = load.ranks
        assert rank0.data_parallel_rank == 0 and rank0.running_requests == 1 and rank0.used_kv_blocks == 4
        for rank in (0, 1):
            await h.stub.Abort(lifecycle_pb2.AbortRequest(request_id=f"r{rank}"))
        for call in calls:
            await read_rest(call)


async def test_runtime_events(trt):
    call = trt.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest(
        types=[observability_pb2.RUNTIME_EVENT_TYPE_FORWARD_PASS, observability_pb2.RUNTIME_EVENT_TYPE_QUEUE]))
    await asyncio.sleep(0.05)
    await collect(trt.stub, gen_request("hi", stopping=g.StoppingOptions(max_tokens=3)))
    seen = []
    while len(seen) < 4:
        r = await asyncio.wait_for(call.read(), 2)
        seen.append(r.runtime_event)
    assert {e.type for e in seen} <= {observability_pb2.RUNTIME_EVENT_TYPE_FORWARD_PASS,
                                      observability_pb2.RUNTIME_EVENT_TYPE_QUEUE}
    assert any(e.type == observability_pb2.RUNTIME_EVENT_TYPE_FORWARD_PASS and "iteration" in e.attributes
               for e in seen)
    call.cancel()


async def _batches(call, count):
    out = []
    while len(out) < count:
        r = await asyncio.wait_for(call.read(), 2)
        out.append(r.batch)
    return out


def kinds(batch):
    return [e.WhichOneof("event") for e in batch.events]


async def first_request(h) -> None:
    """TensorRT-LLM's KV-event queue exists from the first request on (executor.py aget_kv_events):
    one short request (no full block), then the engine's "created" event is consumed."""
    await collect(h.stub, gen_request("hi", stopping=g.StoppingOptions(max_tokens=1)))
    # until the poller has read it (a loaded machine may take a while)
    await eventually(lambda: h.backend.kv._last_event_id, timeout=5,
                     message="the engine's created event was never read")


async def test_kv_events_sequence_replay_snapshot_and_clear(trt):
    await first_request(trt)
    call = trt.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    await asyncio.sleep(0.05)
    await collect(trt.stub, gen_request(token_ids=input_pb2.TokenIds(ids=list(range(10, 22))),
                                        stopping=g.StoppingOptions(max_tokens=1)))
    (b1,) = await _batches(call, 1)
    assert kinds(b1) == ["block_stored"] * 3
    assert list(b1.events[0].block_stored.token_ids) == [10, 11, 12, 13] and b1.events[0].block_stored.block_size == 4
    assert b1.events[1].block_stored.parent_block_hash == b1.events[0].block_stored.block_hashes[0]
    assert b1.events[0].block_stored.medium == kv_pb2.STORAGE_MEDIUM_GPU
    first_hash = b1.events[0].block_stored.block_hashes[0]
    # removal of a block, then an engine restart: a synthesized clear
    raw = int.from_bytes(first_hash.value, "big")
    trt.llm.emit_kv({"type": "removed", "block_hashes": [raw]})
    (b2,) = await _batches(call, 1)
    assert kinds(b2) == ["block_removed"] and b2.sequence_number == b1.sequence_number + 1
    trt.llm.restart_kv()
    (b3,) = await _batches(call, 1)
    assert kinds(b3) == ["all_blocks_cleared"] and b3.sequence_number == b2.sequence_number + 1
    call.cancel()
    # replay from a sequence number
    replay = trt.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(start_sequence_number=b2.sequence_number))
    r = await _batches(replay, 2)
    assert [b.sequence_number for b in r] == [b2.sequence_number, b3.sequence_number]
    replay.cancel()
    # snapshot: cleared + live blocks, at the current sequence number
    await collect(trt.stub, gen_request(token_ids=input_pb2.TokenIds(ids=[1, 2, 3, 4]),
                                        stopping=g.StoppingOptions(max_tokens=1)))
    await asyncio.sleep(0.1)
    snap = trt.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True))
    (s,) = await _batches(snap, 1)
    assert kinds(s) == ["all_blocks_cleared", "block_stored"]
    assert list(s.events[1].block_stored.token_ids) == [1, 2, 3, 4]
    snap.cancel()


async def test_kv_event_gap_synthesizes_clear(trt):
    await first_request(trt)
    trt.llm.emit_kv({"type": "stored", "parent_hash": None, "blocks": [
        {"block_hash": 7, "tokens": [{"token_id": 1}], "cache_level": 0}]})
    await asyncio.sleep(0.05)
    next(trt.llm.event_id)  # an event lost in the engine's bounded buffer
    call = trt.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    await asyncio.sleep(0.05)
    trt.llm.emit_kv({"type": "removed", "block_hashes": [7]})
    (b,) = await _batches(call, 1)
    assert kinds(b) == ["all_blocks_cleared", "block_removed"]
    call.cancel()


async def test_kv_events_per_attention_dp_rank(serve):
    """Each attention-DP rank has its own sequence numbers; a rank the engine does not have is refused."""
    async with serve(fake_trtllm.Args(enable_attention_dp=True, tensor_parallel_size=2)) as h:
        await first_request(h)
        # each rank has its own "created" event: wait for rank 1's too
        await eventually(lambda: 1 in h.backend.kv._last_event_id, timeout=5)
        call = h.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(data_parallel_ranks=[1]))
        await asyncio.sleep(0.05)
        for hash_ in (7, 8):
            h.llm.emit_kv({"type": "stored", "parent_hash": None, "blocks": [
                {"block_hash": hash_, "tokens": [{"token_id": 1}], "cache_level": 0}]}, rank=1)
            await asyncio.sleep(0.05)
        b1, b2 = await _batches(call, 2)
        # rank 1's own "created" event (its sequence number 1) came before the subscription
        assert (b1.data_parallel_rank, b1.sequence_number, b2.sequence_number) == (1, 2, 3)
        call.cancel()
        await expect_status(h.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(data_parallel_ranks=[2])),
                            grpc.StatusCode.INVALID_ARGUMENT, "data_parallel_ranks", "[0, 1]")


def prefill_args():
    """What the sidecar builds for --role prefill|decode (overlap scheduler off on both here)."""
    return fake_trtllm.Args(cache_transceiver_config=fake_trtllm.CacheTransceiverConfig("UCX"),
                            disable_overlap_scheduler=True)


async def test_v0_1_kv_event_sources_list_our_own_stream(serve):
    """TensorRT-LLM's KV events reach us through the engine's own queue, with no publisher to name:
    revision 1's GetKvEventSources stays UNIMPLEMENTED, v0.1.0's lists SubscribeKvEvents itself
    ("transport: grpc, zmq", "encoding: protobuf, msgpack"; clients prefer SubscribeKvEvents), one source
    per attention-DP rank at the advertised host."""
    from openengine_adapters.v0_1 import kv_pb2 as v01_kv
    from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc

    args = fake_trtllm.Args(enable_attention_dp=True, tensor_parallel_size=2,
                            kv_cache_config=fake_trtllm.KvCacheConfig(event_buffer_max_size=64))
    async with serve(args) as h:
        control = v01_grpc.ControlStub(h.channel)
        sources = (await control.GetKvEventSources(v01_kv.GetKvEventSourcesRequest())).sources
        assert [(s.transport, s.encoding, s.data_parallel_rank, s.endpoint_addr.host, s.endpoint_addr.port)
                for s in sources] == [("grpc", "protobuf", r, "127.0.0.1", h.server.port) for r in (0, 1)]
        only = await control.GetKvEventSources(v01_kv.GetKvEventSourcesRequest(data_parallel_ranks=[1]))
        assert [s.data_parallel_rank for s in only.sources] == [1]
        await expect_status(h.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest()),
                            grpc.StatusCode.UNIMPLEMENTED)


async def test_v0_1_prefill_takes_the_decode_legs_options_it_can_honour(serve):
    """A v0.1.0 prefill may carry the decode leg's options (Dynamo's TensorRT-LLM sidecar sends them): guided
    decoding, min_tokens and stops reach the context-only request, whose one sampled token becomes the
    decode's first (first_gen_tokens). Output logprobs need DisaggregatedParams.first_gen_log_probs to reach
    the decode leg (TensorRT-LLM's server carries it: tensorrt_llm/grpc/openengine/disagg.py, commit
    65e93a934b732e876f16fd893c56d21fdc1da1be); 1.2 has no such field, so the prefill's ModelInfo says
    output logprobs are unsupported and they are refused."""
    from openengine_adapters.v1 import model_pb2
    from openengine_adapters.wire.v0_1.stub import V01Stub

    async with serve(prefill_args(), role=EngineRole.PREFILL) as pre:
        v01 = V01Stub(pre.channel)
        req = gen_request(token_ids=input_pb2.TokenIds(ids=[10, 11, 12]),
                          guided=g.GuidedDecoding(choice=g.ChoiceConstraint(choices=["yes", "no"])),
                          stopping=g.StoppingOptions(min_tokens=4, conditions=[g.StopCondition(stop_token_id=5)]))
        s = check_generate_stream(req, await collect(v01, req), prefill=True)
        assert s.prefill_ready.kv_session.session_id
        sp = pre.llm.submitted[-1]["sp"]
        assert sp.guided_decoding is not None and sp.min_tokens == 1 and sp.max_tokens == 1
        lp = gen_request(token_ids=input_pb2.TokenIds(ids=[10, 11, 12]),
                         response=g.ResponseOptions(return_output_logprobs=True))
        await expect_status(v01.Generate(lp), grpc.StatusCode.INVALID_ARGUMENT, "response.return_output_logprobs")
        assert len(pre.llm.submitted) == 1
        info = await v01.GetModelInfo(model_pb2.GetModelInfoRequest(model=pre.server.service.catalog.cards[0].names[0]))
        assert info.generation.output_logprobs.HasField("supported") and not info.generation.output_logprobs.supported
        assert info.generation.guided_decoding.supported  # the decode leg's guide is taken


async def test_v0_1_decode_without_a_session_is_a_local_request(serve):
    """Conditional disaggregation: TensorRT-LLM's own server maps a request with no kv.session and no
    extra.request_type to no DisaggregatedParams at all, a plain request the generation worker serves
    (NVIDIA/TensorRT-LLM tensorrt_llm/grpc/openengine/disagg.py disaggregated_params_from_request, commit
    65e93a934b732e876f16fd893c56d21fdc1da1be), which Dynamo's TensorRT-LLM sidecar relies on for short
    prompts. Served on v0.1.0; revision 1 keeps its role rule."""
    from openengine_adapters.wire.v0_1.stub import V01Stub

    async with serve(prefill_args(), role=EngineRole.DECODE) as dec:
        req = gen_request(token_ids=input_pb2.TokenIds(ids=[10, 11, 12]), stopping=g.StoppingOptions(max_tokens=5))
        d = check_generate_stream(req, await collect(V01Stub(dec.channel), req))
        assert d.text[0] == "hello" and dec.llm.submitted[-1]["disagg"] is None
        await expect_status(dec.stub.Generate(req), grpc.StatusCode.FAILED_PRECONDITION, "kv.session")
        assert len(dec.llm.submitted) == 1


async def test_prefill_decode_round_trip(serve):
    from openengine_adapters.types import EngineRole

    async with serve(prefill_args(), role=EngineRole.PREFILL) as pre, \
            serve(prefill_args(), role=EngineRole.DECODE) as dec:
        dec.llm.context_sessions = pre.llm.context_sessions  # the "transfer" between the fakes
        prompt = input_pb2.TokenIds(ids=[10, 11, 12])
        req = gen_request(token_ids=prompt, request_id="p1")
        s = check_generate_stream(req, await collect(pre.stub, req), prefill=True)
        session = s.prefill_ready.kv_session
        attrs = json_format.MessageToDict(session.attributes_struct)
        # the layout of TensorRT-LLM's own server: session_id = the context request id
        assert session.session_id == str(pre.llm.submitted[-1]["id"]) and session.transfer_backend == "UCX"
        assert "ctx_request_id" not in attrs
        assert attrs["first_gen_tokens"] == [ord("h")] and base64.b64decode(attrs["opaque_state"]).startswith(b"\0")
        assert pre.llm.submitted[-1]["disagg"].request_type == "context_only"
        assert pre.llm.submitted[-1]["sp"].max_tokens == 1
        dreq = gen_request(token_ids=prompt, request_id="d1", kv=g.KvOptions(session=session),
                           stopping=g.StoppingOptions(max_tokens=5))
        d = check_generate_stream(dreq, await collect(dec.stub, dreq))
        assert d.text[0] == "hello"
        assert dec.llm.submitted[-1]["disagg"].request_type == "generation_only"
        assert dec.llm.submitted[-1]["disagg"].opaque_state.startswith(b"\0state")
        # decode validation before acceptance
        for bad, name in ((("opaque_state", None),), "opaque_state"), \
                         ((("first_gen_tokens", "x"),), "first_gen_tokens"), \
                         ((("opaque_state", "!!"),), "opaque_state"):
            a = dict(attrs)
            for k, v in bad:
                if v is None:
                    a.pop(k)
                else:
                    a[k] = v
            ref = kv_pb2.KvSessionRef(session_id=session.session_id)
            json_format.ParseDict(a, ref.attributes_struct)
            await expect_status(dec.stub.Generate(gen_request(token_ids=prompt, kv=g.KvOptions(session=ref))),
                                grpc.StatusCode.INVALID_ARGUMENT, name)
        await expect_status(dec.stub.Generate(gen_request(token_ids=prompt)), grpc.StatusCode.FAILED_PRECONDITION)
        # the decode engine's probe: one local token, no handoff
        health = await dec.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY, health
        assert dec.llm.submitted[-1]["disagg"] is None and dec.llm.submitted[-1]["sp"].max_tokens == 1


async def test_a_session_decodes_once_and_only_its_own_prompt(serve):
    """The shared session table's guarantees (engine_kit/sessions.py): a second decode of one
    session would pull KV the prefill side released; a decode of another prompt would read KV
    computed for a different one. Both are refused before acceptance."""
    async with serve(prefill_args(), role=EngineRole.PREFILL) as pre, \
            serve(prefill_args(), role=EngineRole.DECODE) as dec:
        dec.llm.context_sessions = pre.llm.context_sessions
        prompt = input_pb2.TokenIds(ids=[10, 11, 12])
        sessions = []
        for rid in ("p-once", "p-other"):
            req = gen_request(token_ids=prompt, request_id=rid)
            sessions.append(check_generate_stream(req, await collect(pre.stub, req), prefill=True)
                            .prefill_ready.kv_session)
        assert "prompt_digest" in json_format.MessageToDict(sessions[0].attributes_struct)
        submitted = len(dec.llm.submitted)
        other = gen_request(token_ids=input_pb2.TokenIds(ids=[10, 11, 13]), kv=g.KvOptions(session=sessions[1]))
        await expect_status(dec.stub.Generate(other), grpc.StatusCode.INVALID_ARGUMENT, "prompt", "differs")
        assert len(dec.llm.submitted) == submitted  # refused before the engine saw it
        first = gen_request(token_ids=prompt, request_id="d-once", kv=g.KvOptions(session=sessions[0]),
                            stopping=g.StoppingOptions(max_tokens=3))
        check_generate_stream(first, await collect(dec.stub, first))
        again = gen_request(token_ids=prompt, request_id="d-again", kv=g.KvOptions(session=sessions[0]))
        exc = await expect_status(dec.stub.Generate(again), grpc.StatusCode.NOT_FOUND, "already decoded")
        assert rejection(exc).code == error_pb2.ERROR_CODE_KV_SESSION_NOT_FOUND
        # a refused decode leaves its session usable: the right prompt still decodes it once
        ok = gen_request(token_ids=prompt, request_id="d-other", kv=g.KvOptions(session=sessions[1]),
                         stopping=g.StoppingOptions(max_tokens=3))
        check_generate_stream(ok, await collect(dec.stub, ok))


async def test_prefill_session_abort_releases(serve):
    from openengine_adapters.types import EngineRole

    async with serve(prefill_args(), role=EngineRole.PREFILL) as pre:
        req = gen_request(token_ids=input_pb2.TokenIds(ids=[10, 11]), request_id="p2")
        s = check_generate_stream(req, await collect(pre.stub, req), prefill=True)
        assert pre.backend.open_kv_sessions() == 1
        resp = await pre.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=s.prefill_ready.kv_session))
        assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
        # forgotten, but nothing freed early: the finished context request is gone from the worker,
        # its blocks wait for the transfer, and the adapter says so
        assert pre.backend.open_kv_sessions() == 0 and pre.llm.context_sessions
        assert pre.backend.kv_connector().supports_abort_cleanup is False
        await expect_status(pre.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=s.prefill_ready.kv_session)),
                            grpc.StatusCode.NOT_FOUND)
        probe = await pre.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
        assert probe.state == lifecycle_pb2.HEALTH_STATE_READY


async def test_prefill_sidecar_disables_the_overlap_scheduler_and_refuses_an_engine_with_it(serve):
    """TensorRT-LLM's worker refuses context-only requests while the overlap scheduler runs
    (base_worker.py _enqueue_request): the sidecar turns it off for --role prefill, and a PREFILL
    backend over an engine that still has it on refuses to start instead of failing every request."""
    from openengine_adapters.trtllm.__main__ import parse_args
    from openengine_adapters.trtllm.backend import TrtllmBackend, TrtllmOptions
    from openengine_adapters.trtllm.startup import llm_kwargs
    from openengine_adapters.types import EngineRole

    assert llm_kwargs(parse_args(["m", "--role", "prefill"]))["disable_overlap_scheduler"] is True
    assert "disable_overlap_scheduler" not in llm_kwargs(parse_args(["m", "--role", "decode"]))
    args = fake_trtllm.Args(cache_transceiver_config=fake_trtllm.CacheTransceiverConfig("UCX"))
    with pytest.raises(ValueError, match="disable_overlap_scheduler"):
        TrtllmBackend(fake_trtllm.LLM(args), TrtllmOptions(role=EngineRole.PREFILL))


async def test_prefill_on_an_overlap_engine_fails_in_the_engine(tensorrt_llm):
    """The fake reproduces the refusal: on the stream, as the proxy delivers it."""
    llm = tensorrt_llm.LLM(fake_trtllm.Args(cache_transceiver_config=fake_trtllm.CacheTransceiverConfig("UCX")))
    out = llm.generate_async({"prompt_token_ids": [5, 6]}, tensorrt_llm.SamplingParams(max_tokens=1),
                             disaggregated_params=tensorrt_llm.DisaggregatedParams(request_type="context_only"))
    with pytest.raises(tensorrt_llm.RequestError, match="overlap"):
        await out


async def test_decode_refuses_a_session_without_opaque_state_before_the_engine_stalls(serve):
    """In 1.2 opaque_state is what locates the context worker, and the engine consumes a handoff on
    its executor loop without a timeout: a session without it would stall every request. The
    decode side refuses it before acceptance; the engine keeps serving."""
    async with serve(prefill_args(), role=EngineRole.DECODE) as dec:
        ref = kv_pb2.KvSessionRef(session_id="7", transfer_backend="UCX")
        json_format.ParseDict({"first_gen_tokens": [104]}, ref.attributes_struct)
        req = gen_request(token_ids=input_pb2.TokenIds(ids=[10, 11]), kv=g.KvOptions(session=ref),
                          stopping=g.StoppingOptions(max_tokens=2))
        await asyncio.wait_for(expect_status(dec.stub.Generate(req), grpc.StatusCode.INVALID_ARGUMENT,
                                             "opaque_state"), 5)
        assert not dec.llm.stalled
        health = await asyncio.wait_for(
            dec.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True)), 5)
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY


async def test_kv_polling_is_not_stale_and_no_request_yet_is_not_a_failure(trt):
    """Before the first request TensorRT-LLM's KV queue does not exist (aget_kv_events asserts):
    health stays READY and no AllBlocksCleared is made up. After a read times out, its
    IterationResult stays done until the next submission: events that come while no request
    arrives (an eviction) must still be delivered."""
    await asyncio.sleep(0.2)  # many polls of a queue that does not exist yet
    health = await trt.stub.Health(lifecycle_pb2.HealthRequest())
    assert health.state == lifecycle_pb2.HEALTH_STATE_READY, health
    call = trt.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
    await asyncio.sleep(0.05)
    await collect(trt.stub, gen_request(token_ids=input_pb2.TokenIds(ids=[10, 11, 12, 13]),
                                        stopping=g.StoppingOptions(max_tokens=1)))
    batches = await _batches(call, 1)
    while "block_stored" not in kinds(batches[-1]):
        batches += await _batches(call, 1)
    # one clear, the engine's own "created" event; none made up for the polls that found no queue
    assert [k for b in batches for k in kinds(b)].count("all_blocks_cleared") == 1
    await asyncio.sleep(0.2)  # several read timeouts, no request
    trt.llm.emit_kv({"type": "removed", "block_hashes": [7]})
    (late,) = await _batches(call, 1)
    assert kinds(late) == ["block_removed"]
    call.cancel()


async def test_health_after_the_engine_shut_down_and_output_cap(trt):
    """LLM.shutdown drops its executor: health must say NOT_READY, not READY. max_output_tokens
    leaves room for one prompt token."""
    info = await trt.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="fake-model"))
    assert info.max_output_tokens == info.max_context_length - 1
    trt.llm.shutdown()
    health = await trt.stub.Health(lifecycle_pb2.HealthRequest())
    assert health.state == lifecycle_pb2.HEALTH_STATE_NOT_READY, health
    # generate_async raises RuntimeError("LLM is shutting down"): retryable elsewhere, not INTERNAL
    await expect_status(trt.stub.Generate(gen_request("hi", stopping=g.StoppingOptions(max_tokens=1))),
                        grpc.StatusCode.UNAVAILABLE, "LLM is shutting down")


async def test_a_dead_worker_ends_every_stream_with_one_retryable_error_and_health_turns_not_ready(tensorrt_llm):
    """A TensorRT-LLM worker process dies mid-stream: its requests get no further response (the
    fake's ``LLM.die``), so only the adapter's ``dead()`` - polled by the server's watchdog - ends the
    open Generate stream and the runtime and KV subscriptions, each with one retryable error."""
    from openengine_adapters.trtllm.backend import TrtllmBackend, TrtllmOptions

    llm = fake_trtllm.LLM()
    llm.step_s = 0.02
    backend = TrtllmBackend(llm, TrtllmOptions(poll_timeout_s=0.02, poll_interval_s=0.005))
    async with serve_backend(backend, {"progress_timeout_s": 0}) as h:
        runtime = h.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest())
        kv = h.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
        gen = h.stub.Generate(gen_request("hi", request_id="doomed",
                                          stopping=g.StoppingOptions(max_tokens=200, ignore_eos=True)))
        first = await asyncio.wait_for(gen.read(), 5)
        assert not first.HasField("error")
        assert backend.dead() is None
        health = await h.stub.Health(lifecycle_pb2.HealthRequest())
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY
        llm.die(RuntimeError("CUDA error: an illegal memory access was encountered"))
        assert "worker process exited: CUDA error" in backend.dead()
        for call in (gen, runtime, kv):
            rest = [r for r in await asyncio.wait_for(read_rest(call), 10) if r.HasField("error")]
            assert len(rest) == 1, rest
            err = rest[0].error
            assert (err.code, err.retryable, err.retry_after_ms) == (error_pb2.ERROR_CODE_INTERNAL, True, 0), err
            assert "the engine died: a TensorRT-LLM worker process exited" in err.message
            assert await call.code() == grpc.StatusCode.OK
        health = await h.stub.Health(lifecycle_pb2.HealthRequest())
        assert health.state == lifecycle_pb2.HEALTH_STATE_NOT_READY, health
        assert "illegal memory access" in str(health)
        # the stream's request is gone from the server: a new one is refused before acceptance, retryably
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(h.stub, gen_request("again", stopping=g.StoppingOptions(max_tokens=1)))
        assert refused.value.code() == grpc.StatusCode.INTERNAL
        assert rejection(refused.value).retryable
