"""Discovery, load, KV connector/sources, feature gating, reflection and grpc.health.v1 over real
gRPC calls against the fake backend.

Discovery scalars use proto3 optional presence: a value the engine reports (including an explicit
zero or false) is present, a value it cannot report is absent.
"""

from __future__ import annotations

import asyncio
import re
import time

import grpc
import pytest
from fake_backend import FakeBackend, default_card
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from helpers import eventually, expect_status, gen_request, rejection

from openengine_adapters import backend as be
from openengine_adapters import schema
from openengine_adapters.server import OpenEngineServer
from openengine_adapters.server_config import ADVERTISE_HOST_ENV, ServerConfig, resolve_advertise_host
from openengine_adapters.types import CandidateMode, EngineRole, Feature
from openengine_adapters.v1 import (
    embedding_pb2,
    engine_pb2,
    error_pb2,
    kv_pb2,
    lifecycle_pb2,
    model_pb2,
    observability_pb2,
    openengine_pb2,
    openengine_pb2_grpc,
    tasks_pb2,
)

SERVICE = "openengine.v1.OpenEngine"
SERVED = "tiny"
ALIAS = "tiny-alias"
MODEL_ID = "fake/tiny-model"
WILDCARDS = {"", "*", "0.0.0.0", "::", "[::]"}
_UNSIGNED = {FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64}


# --------------------------------------------------------------------------- GetEngineInfo


async def test_engine_info_identity_and_schema(oe):
    info = await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert info.engine_name == "fake"
    assert info.engine_version == "0.0.1"
    assert info.role == engine_pb2.ENGINE_ROLE_AGGREGATED
    assert info.instance_id
    assert list(info.supported_models) == [SERVED]
    assert info.schema_revision == 1
    assert info.minimum_client_revision == 1
    assert info.schema_release == schema.SCHEMA_RELEASE
    assert re.fullmatch(r"[0-9a-f]{40}", info.schema_release), (
        f"schema_release must be an immutable commit, got {info.schema_release!r}")
    assert info.schema_release not in {"main", "master", "HEAD"}


async def test_engine_info_parallelism_presence(oe):
    info = await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert info.HasField("parallelism")
    p = info.parallelism
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        assert p.HasField(name), name
        assert getattr(p, name) == 1, name
    assert p.HasField("data_parallel_rank"), "an explicit zero rank must be present"
    assert p.data_parallel_rank == 0
    assert not p.HasField("data_parallel_start_rank"), "unreported -> absent"


async def test_engine_info_kv_connector_for_aggregated(oe):
    info = await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert info.HasField("kv_connector")
    assert info.kv_connector.HasField("enabled"), "enabled=false is a reported value"
    assert info.kv_connector.enabled is False


async def test_engine_info_instance_id_from_config(serve):
    async with serve({"instance_id": "node-7"}) as h:
        info = await h.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
        load = await h.stub.GetLoad(observability_pb2.GetLoadRequest())
    assert info.instance_id == load.instance_id == "node-7"


# --------------------------------------------------------------------------- GetModelInfo


async def test_model_info_requires_model(oe):
    exc = await expect_status(oe.stub.GetModelInfo(model_pb2.GetModelInfoRequest()),
                              grpc.StatusCode.INVALID_ARGUMENT, "model")
    err = rejection(exc)
    assert err is not None and err.code == error_pb2.ERROR_CODE_INVALID_ARGUMENT


async def test_model_info_unknown_model(oe):
    exc = await expect_status(oe.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="nope")),
                              grpc.StatusCode.NOT_FOUND, "nope")
    err = rejection(exc)
    assert err is not None and err.code == error_pb2.ERROR_CODE_MODEL_NOT_FOUND


@pytest.mark.parametrize("name", [SERVED, ALIAS, MODEL_ID])
async def test_model_info_by_any_name(oe, name):
    info = await oe.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=name))
    assert info.model_id == MODEL_ID
    assert info.served_model_name == SERVED
    assert list(info.served_model_aliases) == [ALIAS]


async def test_model_info_served_name_is_in_supported_models(oe):
    engine = await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    for model in engine.supported_models:
        info = await oe.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=model))
        assert info.served_model_name == model


async def test_model_info_reports_default_card(oe):
    info = await oe.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=SERVED))
    assert info.max_context_length == 512
    assert info.max_output_tokens == 256
    assert info.kv_block_size == 16
    assert info.total_kv_blocks == 1000
    assert list(info.tokenizer_modes) == ["auto"]
    assert info.HasField("supports_multimodal") and info.supports_multimodal is False
    assert info.HasField("supports_lora") and info.supports_lora is True
    gen = info.generation
    assert gen.output_logprobs.supported is True
    assert list(gen.output_logprobs.candidate_selection_modes) == [
        model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N, model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
        model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_ALL]
    assert list(gen.guided_decoding.modes) == [model_pb2.GUIDED_DECODING_MODE_CHOICE,
                                               model_pb2.GUIDED_DECODING_MODE_JSON_OBJECT]
    assert info.tasks.embed.supported and info.tasks.classify.supported and info.tasks.score.supported
    assert info.tasks.embed.dimension == 8
    assert info.tasks.score.HasField("supports_instruction") and not info.tasks.score.supports_instruction


SPARSE_CARD = default_card(
    model_id="fake/sparse", served_model_name="sparse", served_model_aliases=(),
    max_output_tokens=None, kv_block_size=None, total_kv_blocks=None, max_batched_tokens=None,
    supports_token_ids_input=False, supports_multimodal=False, supports_lora=False,
    generation=be.GenerationSupport(
        prompt_logprobs=be.LogprobSupport(supported=False),
        output_logprobs=None,
        guided_decoding=be.GuidedSupport(supported=True, modes=()),
        max_num_sequences=None,
        supports_priority=False,
    ),
    tasks=be.TaskSupport(embed=be.EmbedSupport(supported=False)),
)


async def test_model_info_optional_presence_both_ways(serve):
    async with serve(None, cards=[default_card(), SPARSE_CARD]) as h:
        engine = await h.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
        info = await h.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="sparse"))
    assert list(engine.supported_models) == [SERVED, "sparse"]
    assert info.served_model_name == "sparse"
    assert list(info.served_model_aliases) == []
    # Reported values, including an explicit False, are present.
    assert info.HasField("max_context_length") and info.max_context_length == 512
    for name in ("supports_token_ids_input", "supports_multimodal", "supports_lora"):
        assert info.HasField(name), name
        assert getattr(info, name) is False, name
    assert info.HasField("supports_text_input") and info.supports_text_input is True
    # Values the card leaves as None are absent, not zero.
    for name in ("max_output_tokens", "kv_block_size", "total_kv_blocks", "max_batched_tokens"):
        assert not info.HasField(name), name
    gen = info.generation
    assert gen.HasField("prompt_logprobs")
    assert gen.prompt_logprobs.HasField("supported") and gen.prompt_logprobs.supported is False
    assert not gen.prompt_logprobs.HasField("max_top_n")
    assert not gen.HasField("output_logprobs"), "unreported capability -> submessage absent"
    assert gen.guided_decoding.HasField("supported") and list(gen.guided_decoding.modes) == []
    assert not gen.HasField("max_num_sequences")
    assert gen.HasField("supports_priority") and gen.supports_priority is False
    assert not gen.HasField("supports_cache_salt")
    assert info.HasField("tasks")
    assert info.tasks.HasField("embed") and info.tasks.embed.HasField("supported")
    assert info.tasks.embed.supported is False
    assert not info.tasks.embed.HasField("dimension")
    assert not info.tasks.HasField("classify") and not info.tasks.HasField("score")


async def test_model_info_without_tasks_or_generation(serve):
    card = default_card(tasks=None, generation=None, supports_text_input=None)
    async with serve(None, cards=[card]) as h:
        info = await h.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=SERVED))
    assert not info.HasField("tasks")
    assert not info.HasField("generation")
    assert not info.HasField("supports_text_input")


def _walk_capabilities(msg, path: str, problems: list[str]) -> None:
    for field, value in msg.ListFields():
        where = f"{path}.{field.name}"
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            subs = list(value) if field.is_repeated else [value]
            for i, sub in enumerate(subs):
                _walk_capabilities(sub, f"{where}[{i}]" if field.is_repeated else where, problems)
        elif field.type == FieldDescriptor.TYPE_ENUM and field.is_repeated:
            if 0 in list(value):
                problems.append(f"{where} contains UNSPECIFIED: {list(value)}")
        elif field.cpp_type in _UNSIGNED and value <= 0:
            problems.append(f"{where} = {value} (reported limits must be > 0)")


@pytest.mark.parametrize("model", [SERVED, "sparse"])
async def test_model_info_lists_and_limits(serve, model):
    async with serve(None, cards=[default_card(), SPARSE_CARD]) as h:
        info = await h.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=model))
    problems: list[str] = []
    _walk_capabilities(info, "ModelInfo", problems)
    assert not problems, "\n".join(problems)


async def test_card_breaking_discovery_rules_is_refused_at_startup(serve):
    """The server never emits UNSPECIFIED in a capability list or a zero limit: such a card
    stops start-up with a message naming each offending field."""
    card = default_card(
        max_output_tokens=0,
        generation=be.GenerationSupport(output_logprobs=be.LogprobSupport(
            supported=True, candidate_selection_modes=(CandidateMode.UNSPECIFIED, CandidateMode.TOP_N),
            max_top_n=0)))
    with pytest.raises(ValueError) as info:
        async with serve(None, cards=[card]):
            pass
    message = str(info.value)
    for field in ("max_output_tokens", "candidate_selection_modes contains UNSPECIFIED", "max_top_n"):
        assert field in message


# --------------------------------------------------------------------------- GetLoad


async def test_load_idle_snapshot(oe):
    engine = await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    before = time.time_ns()
    load = await oe.stub.GetLoad(observability_pb2.GetLoadRequest())
    after = time.time_ns()
    assert load.instance_id == engine.instance_id
    assert load.HasField("timestamp_unix_nanos")
    assert before - 5_000_000_000 <= load.timestamp_unix_nanos <= after + 5_000_000_000
    assert load.HasField("running_requests") and load.running_requests == 0
    assert load.HasField("queued_requests") and load.queued_requests == 0
    assert load.HasField("total_kv_blocks") and load.total_kv_blocks == 1000
    assert not load.HasField("running_tokens"), "unavailable in this engine -> absent"
    assert not load.HasField("active_kv_sessions"), "an aggregated fake has no KV sessions to count"
    # revision 1's attributes are strings: JSON values as JSON writes them
    assert dict(load.attributes) == {"engine": "fake", "in_flight": "0", "warm": "true", "ratio": "0.5"}
    assert list(load.ranks) == []


async def test_load_counts_a_running_request(oe):
    call = oe.stub.Generate(gen_request("hi", request_id="busy", metadata={"fake.step_delay_ms": "50"},
                                        stopping={"max_tokens": 50}))
    it = call.__aiter__()
    await it.__anext__()  # accepted and running
    try:
        load = await oe.stub.GetLoad(observability_pb2.GetLoadRequest())
        assert load.running_requests == 1
    finally:
        call.cancel()


async def test_load_per_rank_toggle(serve):
    async with serve(None, data_parallel_size=2) as h:
        without = await h.stub.GetLoad(observability_pb2.GetLoadRequest(include_per_rank=False))
        with_ranks = await h.stub.GetLoad(observability_pb2.GetLoadRequest(include_per_rank=True))
        engine = await h.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert list(without.ranks) == []
    assert len(with_ranks.ranks) == 2
    assert [r.data_parallel_rank for r in with_ranks.ranks] == [0, 1]
    for r in with_ranks.ranks:
        assert r.HasField("data_parallel_rank"), "rank 0 is a reported zero"
        assert r.HasField("running_requests") and r.running_requests == 0
        assert r.HasField("queued_requests")
        assert not r.HasField("used_kv_blocks")
    assert with_ranks.instance_id == without.instance_id == engine.instance_id
    assert engine.parallelism.data_parallel_size == 2


# --------------------------------------------------------------------------- KV connector


async def test_kv_connector_aggregated(oe):
    conn = await oe.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest())
    assert conn.HasField("enabled") and conn.enabled is False
    assert conn.transfer_backend == ""
    assert list(conn.local_endpoints) == []


async def test_kv_connector_prefill(serve):
    async with serve(None, role=EngineRole.PREFILL) as h:
        conn = await h.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest())
        engine = await h.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert conn.HasField("enabled") and conn.enabled is True
    assert conn.transfer_backend == "fake"
    assert [(e.host, e.port, e.protocol) for e in conn.local_endpoints] == [("127.0.0.1", 7000, "tcp")]
    assert list(conn.supported_protocols) == ["tcp"]
    assert conn.HasField("supports_decode_pull") and conn.supports_decode_pull is False
    assert conn.supports_remote_prefill and conn.supports_abort_cleanup and conn.supports_drain
    assert conn.HasField("schema_version") and conn.schema_version == 1
    assert engine.role == engine_pb2.ENGINE_ROLE_PREFILL
    assert engine.kv_connector == conn


async def test_prefill_model_info_reports_what_the_role_accepts(serve):
    """The fake model supports guided decoding and output logprobs; a PREFILL engine refuses both
    (role rule), so its ModelInfo says supported=false, with one sequence and one output token."""
    async with serve(None, role=EngineRole.PREFILL) as h:
        mi = await h.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
        guided = gen_request()
        guided.guided.json_object.SetInParent()
        await expect_status(h.stub.Generate(guided), grpc.StatusCode.FAILED_PRECONDITION, "guided")
    gen = mi.generation
    assert gen.output_logprobs.HasField("supported") and gen.output_logprobs.supported is False
    assert list(gen.output_logprobs.candidate_selection_modes) == []
    assert gen.guided_decoding.HasField("supported") and gen.guided_decoding.supported is False
    assert list(gen.guided_decoding.modes) == []
    assert gen.max_num_sequences == 1 and mi.max_output_tokens == 1
    assert gen.prompt_logprobs.supported is True  # prompt logprobs still come with a prefill


# --------------------------------------------------------------------------- KV event sources


async def test_kv_event_sources_never_advertise_a_wildcard(oe):
    resp = await oe.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
    assert len(resp.sources) == 1
    src = resp.sources[0]
    assert src.endpoint_addr.host not in WILDCARDS
    assert src.endpoint_addr.host == "127.0.0.1"
    assert src.endpoint_addr.port == 5557
    assert (src.transport, src.topic, src.encoding) == ("zmq", "kv", "msgpack")
    assert src.replay_endpoint == "tcp://127.0.0.1:5558"
    assert src.HasField("data_parallel_rank") and src.data_parallel_rank == 0
    assert (src.schema_version, src.buffer_steps, src.hwm, src.max_queue_size) == (1, 100, 10000, 1000)


async def test_kv_event_sources_use_configured_advertise_host():
    # conftest's serve() pins advertise_host to 127.0.0.1, so start this server directly.
    cfg = ServerConfig(host="127.0.0.1", port=0, advertise_host="10.1.2.3", drain_grace_s=0.5)
    server = await OpenEngineServer(FakeBackend(), cfg).start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            resp = await stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
    finally:
        await server.stop(0.5)
    assert [s.endpoint_addr.host for s in resp.sources] == ["10.1.2.3"]


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "[::]", "*", ""])
def test_advertise_host_for_wildcard_bind_is_routable(bind, monkeypatch):
    monkeypatch.delenv(ADVERTISE_HOST_ENV, raising=False)
    assert resolve_advertise_host(bind, None) not in WILDCARDS


@pytest.mark.parametrize("flag", sorted(WILDCARDS - {""}))
def test_wildcard_advertise_host_is_refused(flag):
    with pytest.raises(ValueError):
        resolve_advertise_host("127.0.0.1", flag)


async def test_kv_event_sources_rank_filter(serve):
    async with serve(None, data_parallel_size=2) as h:
        every = await h.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
        one = await h.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(data_parallel_ranks=[1]))
        zero = await h.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(data_parallel_ranks=[0]))
        both = await h.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(data_parallel_ranks=[1, 0]))
    assert [s.data_parallel_rank for s in every.sources] == [0, 1]
    assert [s.data_parallel_rank for s in one.sources] == [1]
    assert [s.data_parallel_rank for s in zero.sources] == [0]
    assert sorted(s.data_parallel_rank for s in both.sources) == [0, 1]
    for resp in (every, one, zero, both):
        for s in resp.sources:
            assert s.endpoint_addr.host == "127.0.0.1"


# --------------------------------------------------------------------------- unimplemented features


async def test_missing_features_answer_unimplemented(serve):
    card = default_card(tasks=None, supports_lora=False)
    async with serve(None, features=frozenset({Feature.GENERATE}), cards=[card]) as h:
        calls = {
            "GetLoad": h.stub.GetLoad(observability_pb2.GetLoadRequest()),
            "Abort": h.stub.Abort(lifecycle_pb2.AbortRequest(request_id="r")),
            "GetKvEventSources": h.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest()),
            "SubscribeKvEvents": h.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest()),
            "SubscribeRuntimeEvents": h.stub.SubscribeRuntimeEvents(
                observability_pb2.SubscribeRuntimeEventsRequest()),
        }
        for name, call in calls.items():
            exc = await expect_status(call, grpc.StatusCode.UNIMPLEMENTED)
            err = rejection(exc)
            assert err is not None, name
            assert err.code == error_pb2.ERROR_CODE_UNSUPPORTED_FEATURE, name
        # A task the model does not advertise is FAILED_PRECONDITION (spec), not UNIMPLEMENTED.
        await expect_status(h.stub.Embed(embedding_pb2.EmbedRequest(
            context=tasks_pb2.TaskRequestContext(request_id="e", model=SERVED),
            inputs=[tasks_pb2.TaskInput(item_id="a", text="x")])), grpc.StatusCode.FAILED_PRECONDITION)
        # What the backend does implement still works, and discovery always does.
        info = await h.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
        assert info.schema_revision == 1
        conn = await h.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest())
        assert conn.HasField("enabled")
        responses = [r async for r in h.stub.Generate(gen_request("hi"), timeout=10)]
        assert responses[-1].WhichOneof("event") == "finished"


# --------------------------------------------------------------------------- reflection


def _reflect(target: str):
    with grpc.insecure_channel(target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = list(db.get_services())
        pool = descriptor_pool.DescriptorPool(db)
        svc = pool.FindServiceByName(SERVICE)
        methods = {m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming,
                            m.server_streaming) for m in svc.methods}
        return services, svc.file.name, methods


async def test_server_reflection(oe):
    services, file_name, methods = await asyncio.wait_for(asyncio.to_thread(_reflect, oe.target), 10)
    assert SERVICE in services
    assert "grpc.health.v1.Health" in services
    assert file_name == "openengine/v1/openengine.proto"
    assert len(methods) == 17
    ours = openengine_pb2.DESCRIPTOR.services_by_name["OpenEngine"]
    assert methods == {m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming,
                                m.server_streaming) for m in ours.methods}


# --------------------------------------------------------------------------- grpc.health.v1 and drain


async def _grpc_health(channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return resp.status


async def test_grpc_health_serving_when_ready(oe):
    for service in ("", SERVICE):
        assert await _grpc_health(oe.channel, service) == health_pb2.HealthCheckResponse.SERVING
    resp = await oe.stub.Health(lifecycle_pb2.HealthRequest())
    assert resp.state == lifecycle_pb2.HEALTH_STATE_READY
    assert "drain" not in {c.name for c in resp.checks}


async def test_grpc_health_unknown_service(oe):
    stub = health_pb2_grpc.HealthStub(oe.channel)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND


async def test_drain_flips_health_and_refuses_work(oe):
    events = [r async for r in oe.stub.Drain(
        lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True), timeout=10)]
    assert events[0].state == lifecycle_pb2.DRAIN_STATE_STARTED
    assert events[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE
    for service in ("", SERVICE):
        async def not_serving(service=service):
            return await _grpc_health(oe.channel, service) == health_pb2.HealthCheckResponse.NOT_SERVING
        await eventually(not_serving, timeout=2, message=f"{service!r} still serving after the drain")
    resp = await oe.stub.Health(lifecycle_pb2.HealthRequest())
    assert resp.state == lifecycle_pb2.HEALTH_STATE_DRAINING
    drain = [c for c in resp.checks if c.name == "drain"]
    assert len(drain) == 1 and drain[0].state == lifecycle_pb2.HEALTH_STATE_DRAINING
    exc = await expect_status(oe.stub.Generate(gen_request("hi")), grpc.StatusCode.UNAVAILABLE)
    err = rejection(exc)
    assert err is not None and err.code == error_pb2.ERROR_CODE_DRAINING
    # Discovery keeps answering while draining.
    info = await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert info.schema_revision == 1


async def test_grpc_health_is_not_serving_immediately_after_drain(oe):
    """No polling: once the drain stream completed, a load balancer must already see NOT_SERVING."""
    async for _ in oe.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True), timeout=10):
        pass
    for service in ("", SERVICE):
        assert await _grpc_health(oe.channel, service) == health_pb2.HealthCheckResponse.NOT_SERVING
