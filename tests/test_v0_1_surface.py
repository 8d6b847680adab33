"""The v0.1.0 surface (openengine.v1.Inference + Control) beside revision 1, on the fake engine.

One port, one core: what either surface starts, the other sees (Abort, GetLoad, drain). The
v0.1.0-only rules: metadata keys, ``extra``, renumbered KvOptions, ErrorCode/HealthState without
DRAINING, ServerInfo capacity, ModelInfo/LoadInfo shapes, MODALITY_UNSPECIFIED.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import json_format
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import collect, expect_status, gen_request, read_rest, rejection, v0_1_client_argv

from openengine_adapters import schema
from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.server_config import parse_surfaces
from openengine_adapters.types import EngineRole, ErrorCode
from openengine_adapters.v0_1 import error_pb2 as v01_error
from openengine_adapters.v0_1 import generation_pb2 as v01_gen
from openengine_adapters.v0_1 import kv_pb2 as v01_kv
from openengine_adapters.v0_1 import lifecycle_pb2 as v01_life
from openengine_adapters.v0_1 import lora_pb2 as v01_lora
from openengine_adapters.v0_1 import model_pb2 as v01_model
from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc
from openengine_adapters.v0_1 import server_pb2 as v01_server
from openengine_adapters.v1 import engine_pb2, kv_pb2, lifecycle_pb2, lora_pb2, observability_pb2

SLOW = (("fake.step_delay_ms", "50"),)


def stubs(h):
    return v01_grpc.InferenceStub(h.channel), v01_grpc.ControlStub(h.channel)


def v01_rejection(exc: grpc.aio.AioRpcError) -> v01_error.EngineError:
    values = [v for k, v in exc.trailing_metadata() or () if k == ERROR_TRAILER]
    assert values, f"no {ERROR_TRAILER} trailer on {exc.code()}: {exc.details()}"
    return v01_error.EngineError.FromString(values[0])


def req(prompt: str = "hi", max_tokens: int = 4, **kw) -> v01_gen.GenerateRequest:
    return v01_gen.GenerateRequest(prompt=prompt, stopping=v01_gen.StoppingOptions(max_tokens=max_tokens), **kw)


async def v01_collect(inference, request, metadata=(), timeout=10.0):
    return [r async for r in inference.Generate(request, metadata=metadata, timeout=timeout)]


async def test_one_port_serves_three_services_and_reflection_lists_them(oe):
    stub = reflection_pb2_grpc.ServerReflectionStub(oe.channel)
    responses = [r async for r in stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
        list_services="")]))]
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"openengine.v1.OpenEngine", "openengine.v1.Inference", "openengine.v1.Control"} <= names
    # every service resolves to a file descriptor (what grpcurl needs to call it)
    for symbol in ("openengine.v1.Inference", "openengine.v1.Control", "openengine.v1.OpenEngine"):
        out = [r async for r in stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol=symbol)]))]
        assert out[0].HasField("file_descriptor_response"), symbol


async def test_server_info_reports_capacity_release_and_extra(oe):
    _, control = stubs(oe)
    info = await control.GetServerInfo(v01_server.GetServerInfoRequest())
    assert info.schema_release == schema.V0_1_SCHEMA_RELEASE and info.schema_revision == 1
    assert info.minimum_client_revision == 1
    assert info.engine_name == "fake" and info.engine_role == v01_server.ENGINE_ROLE_AGGREGATED
    assert list(info.supported_models) == ["tiny"]
    cap = info.capacity
    assert (cap.kv_block_size, cap.total_kv_blocks, cap.max_running_requests, cap.max_batched_tokens,
            cap.max_loras) == (16, 1000, 64, 2048, 4)
    assert info.parallelism.HasField("decode_context_parallel_size")
    assert info.parallelism.decode_context_parallel_size == 1
    assert info.kv_connector.HasField("enabled") and info.kv_connector.enabled is False
    extra = json_format.MessageToDict(info.extra)
    assert extra["fake_build"] == "test" and extra["fake_steps_per_token"] == 1
    assert extra["revision1_schema_release"] == schema.SCHEMA_RELEASE
    assert set(extra["services"]) == {"openengine.v1.OpenEngine", "openengine.v1.Inference",
                                      "openengine.v1.Control"}


async def test_kv_connector_renumbered_without_supports_drain(serve):
    async with serve(role=EngineRole.PREFILL) as h:
        _, control = stubs(h)
        conn = (await control.GetServerInfo(v01_server.GetServerInfoRequest())).kv_connector
        assert conn.enabled and conn.transfer_backend == "fake"
        assert conn.HasField("schema_version") and conn.schema_version == 1
        # field 8 is schema_version in v0.1.0: revision 1's supports_drain must not leak into it
        assert "supports_drain" not in v01_kv.KvConnectorInfo.DESCRIPTOR.fields_by_name
        assert conn.SerializeToString() == v01_kv.KvConnectorInfo(
            enabled=True, transfer_backend="fake", local_endpoints=[v01_kv.KvEndpoint(
                host="127.0.0.1", port=7000, protocol="tcp")], supported_protocols=["tcp"],
            supports_remote_prefill=True, supports_decode_pull=False, supports_abort_cleanup=True,
            schema_version=1).SerializeToString()


async def test_model_info_drops_moved_fields_and_carries_extra(oe):
    _, control = stubs(oe)
    mi = await control.GetModelInfo(v01_model.GetModelInfoRequest(model="tiny-alias"))
    assert mi.served_model_name == "tiny" and mi.max_context_length == 512 and mi.max_output_tokens == 256
    assert mi.generation.supports_priority and mi.generation.max_num_sequences == 4
    extra = json_format.MessageToDict(mi.extra)
    assert extra["fake_dtype"] == "char"
    assert extra["request_extra_keys"]["fake_flag"]["type"] == "bool"
    assert extra["revision1_tasks"] == ["embed", "classify", "score"]
    err = await expect_status(control.GetModelInfo(v01_model.GetModelInfoRequest(model="nope")),
                              grpc.StatusCode.NOT_FOUND, "model")
    assert v01_rejection(err).code == v01_error.ERROR_CODE_MODEL_NOT_FOUND


async def test_generate_streams_with_usage_on_the_final_event(oe):
    inference, _ = stubs(oe)
    out = await v01_collect(inference, req(request_id="v01-a", max_tokens=3))
    events = [r.WhichOneof("event") for r in out]
    assert events[-1] == "finished" and "token" in events
    assert out[-1].HasField("usage") and out[-1].usage.completion_tokens == 3
    assert all(r.request_id == "v01-a" for r in out)
    rev1 = await collect(oe.stub, gen_request(stopping={"max_tokens": 3}))
    text = lambda rs: "".join(r.token.text for r in rs if r.WhichOneof("event") == "token")  # noqa: E731
    assert text(out) == text(rev1), "both surfaces run the same engine path"


async def test_abort_and_load_cross_the_surfaces(oe):
    inference, control = stubs(oe)
    call = inference.Generate(req(request_id="v01-long", max_tokens=200), metadata=SLOW)
    first = await call.read()
    assert first.WhichOneof("event") in ("token", "prompt")
    load = await control.GetLoad(v01_server.GetLoadRequest())
    assert load.running_requests == 1
    rev1_load = await oe.stub.GetLoad(observability_pb2.GetLoadRequest())
    assert rev1_load.running_requests == 1
    # revision 1's Abort ends the v0.1.0 stream
    ack = await oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id="v01-long"))
    assert ack.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    rest = await read_rest(call)
    assert rest[-1].WhichOneof("event") == "finished"
    assert rest[-1].finished.reason == v01_gen.FINISH_REASON_CANCELLED
    # and Control.Abort ends a revision-1 stream
    rev1 = oe.stub.Generate(gen_request(request_id="r1-long", stopping={"max_tokens": 200}),
                            metadata=SLOW)
    await rev1.read()
    done = await control.Abort(v01_life.AbortRequest(request_id="r1-long"))
    assert done.status == v01_life.ABORT_STATUS_ABORTED
    assert (await read_rest(rev1))[-1].finished.reason == v01_gen.FINISH_REASON_CANCELLED
    again = await control.Abort(v01_life.AbortRequest(request_id="r1-long"))
    assert again.status == v01_life.ABORT_STATUS_ALREADY_FINISHED
    err = await expect_status(control.Abort(v01_life.AbortRequest(request_id="unknown")),
                              grpc.StatusCode.NOT_FOUND, "request_id")
    assert v01_rejection(err).code == v01_error.ERROR_CODE_REQUEST_NOT_FOUND


async def test_drain_refuses_v0_1_work_with_the_documented_mapping(oe):
    inference, control = stubs(oe)
    drain = oe.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True, deadline_ms=0))
    async for _ in drain:
        pass
    err = await expect_status(inference.Generate(req()), grpc.StatusCode.UNAVAILABLE)
    error = v01_rejection(err)
    assert error.code == v01_error.ERROR_CODE_OVERLOADED and error.retryable
    health = await control.Health(v01_life.HealthRequest())
    assert health.state == v01_life.HEALTH_STATE_NOT_READY == 4


async def test_engine_failure_is_one_terminal_error_in_v0_1_numbering(oe):
    inference, _ = stubs(oe)
    out = await v01_collect(inference, req(max_tokens=10), metadata=(("fake.crash_after", "2"),))
    assert out[-1].WhichOneof("event") == "error"
    assert out[-1].error.code == v01_error.ERROR_CODE_INTERNAL == 11
    assert [r.WhichOneof("event") for r in out].count("error") == 1


async def test_priority_metadata(oe):
    inference, _ = stubs(oe)
    await v01_collect(inference, req(), metadata=(("openengine-priority", "-7"),))
    assert oe.fake.seen_params[-1].priority == -7
    for value, fragment in (("abc", "not a base-10 int32"), ("2147483648", "out of the int32 range"),
                            ("+5", "not a base-10 int32"), ("", "not a base-10 int32")):
        err = await expect_status(inference.Generate(req(), metadata=(("openengine-priority", value),)),
                                  grpc.StatusCode.INVALID_ARGUMENT, "openengine-priority", fragment)
        assert v01_rejection(err).code == v01_error.ERROR_CODE_INVALID_ARGUMENT
    await expect_status(inference.Generate(req(), metadata=(("openengine-priority", "1"),
                                                            ("openengine-priority", "2"))),
                        grpc.StatusCode.INVALID_ARGUMENT, "openengine-priority", "more than once")


def rev1_kv_options(**kw):
    from openengine_adapters.v1 import generation_pb2 as rev1_gen

    return rev1_gen.KvOptions(**kw)


def _card_without(**generation):
    from fake_backend import default_card

    from openengine_adapters import backend as be

    card = default_card()
    return be.ModelCard(**{**card.__dict__, "generation": be.GenerationSupport(
        **{**card.generation.__dict__, **generation})})


def _scrape() -> dict[str, float]:
    from prometheus_client import REGISTRY, generate_latest

    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in generate_latest(REGISTRY).decode().splitlines() if line and not line.startswith("#")}


async def test_priority_without_support_is_served_in_default_order_counted_and_said_once(serve, caplog):
    """Upstream: "The priority key is used only when the selected model and task advertise priority
    support" -- a router sends it on every request; revision 1 (a request field) still refuses it."""
    async with serve(cards=[_card_without(supports_priority=False)], config={"metrics": True}) as h:
        inference, control = stubs(h)
        for _ in range(2):
            events = await v01_collect(inference, req(), metadata=(("openengine-priority", "3"),))
            assert events[-1].HasField("finished")
            assert h.fake.seen_params[-1].priority is None  # never handed to the engine
        mi = await control.GetModelInfo(v01_model.GetModelInfoRequest(model="tiny"))
        assert mi.generation.HasField("supports_priority") and not mi.generation.supports_priority
        load = await control.GetLoad(v01_server.GetLoadRequest())
        assert load.attributes["openengine.priority_ignored"] == 2
        assert _scrape()["openengine_priority_ignored_total"] == 2
        said = [r for r in caplog.records if "openengine-priority" in r.getMessage()]
        assert len(said) == 1 and "default order" in said[0].getMessage()
        # malformed values stay INVALID_ARGUMENT
        await expect_status(inference.Generate(req(), metadata=(("openengine-priority", "high"),)),
                            grpc.StatusCode.INVALID_ARGUMENT, "openengine-priority", "base-10 int32")
        err = await expect_status(h.stub.Generate(gen_request("hi", priority=3)),
                                  grpc.StatusCode.INVALID_ARGUMENT, "priority", "does not advertise")
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert h.server.service.leniency.priority_ignored == 2  # revision 1's refusal is not counted


async def test_explicit_defaults_of_unadvertised_options_are_served(serve):
    """Dynamo forwards a user's bypass_prefix_cache=false as present-and-false: it asks for what every
    engine does anyway, as do include_stop_in_output=false and an empty cache_salt. true is still
    refused on v0.1.0, and revision 1 refuses every explicit unadvertised option."""
    card = _card_without(supports_prefix_cache_bypass=False, supports_stop_in_output=False,
                         supports_cache_salt=False)
    async with serve(cards=[card]) as h:
        inference, _ = stubs(h)
        defaults = dict(kv=v01_gen.KvOptions(bypass_prefix_cache=False, cache_salt=""),
                        stopping=v01_gen.StoppingOptions(max_tokens=2, include_stop_in_output=False))
        assert (await v01_collect(inference, v01_gen.GenerateRequest(prompt="hi", **defaults)))[-1].HasField("finished")
        seen = h.fake.seen_params[-1]
        assert seen.bypass_prefix_cache is None and seen.cache_salt is None
        assert seen.stopping.include_stop_in_output is None
        for fields, fragment in ((dict(kv=v01_gen.KvOptions(bypass_prefix_cache=True)), "kv.bypass_prefix_cache"),
                                 (dict(kv=v01_gen.KvOptions(cache_salt="tenant")), "kv.cache_salt"),
                                 (dict(stopping=v01_gen.StoppingOptions(include_stop_in_output=True)),
                                  "stopping.include_stop_in_output")):
            await expect_status(inference.Generate(v01_gen.GenerateRequest(prompt="hi", **fields)),
                                grpc.StatusCode.INVALID_ARGUMENT, fragment)
        from openengine_adapters.v1 import generation_pb2 as rev1_gen

        await expect_status(h.stub.Generate(gen_request("hi", kv=rev1_gen.KvOptions(bypass_prefix_cache=False))),
                            grpc.StatusCode.INVALID_ARGUMENT, "kv.bypass_prefix_cache")
        await expect_status(h.stub.Generate(gen_request("hi", stopping=rev1_gen.StoppingOptions(
            include_stop_in_output=False))), grpc.StatusCode.INVALID_ARGUMENT, "include_stop_in_output")


async def test_target_dp_rank_metadata(serve):
    async with serve(data_parallel_size=2) as h:
        inference, _ = stubs(h)
        await v01_collect(inference, req(), metadata=(("openengine-target-dp-rank", "1"),))
        assert h.fake.seen_params[-1].data_parallel_rank == 1
        await expect_status(inference.Generate(req(), metadata=(("openengine-target-dp-rank", "2"),)),
                            grpc.StatusCode.INVALID_ARGUMENT, "openengine-target-dp-rank", "out of range")
        await expect_status(inference.Generate(req(), metadata=(("openengine-target-dp-rank", "-1"),)),
                            grpc.StatusCode.INVALID_ARGUMENT, "uint32")


async def test_target_dp_rank_disagreeing_with_the_session_is_invalid(serve):
    async with serve(role=EngineRole.DECODE, data_parallel_size=2) as h:
        inference, _ = stubs(h)
        session = v01_kv.KvSessionRef(session_id="s1", transfer_backend="fake", dp_rank=0)
        await expect_status(
            inference.Generate(req(kv=v01_gen.KvOptions(session=session)),
                               metadata=(("openengine-target-dp-rank", "1"),)),
            grpc.StatusCode.INVALID_ARGUMENT, "openengine-target-dp-rank", "kv.session.dp_rank")


async def test_routing_key_and_trace_context(oe):
    inference, _ = stubs(oe)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await v01_collect(inference, req(), metadata=(("openengine-routing-key", "tenant-7"), ("traceparent", parent),
                                                  ("tracestate", "vendor=x"), ("x-app", "kept"),
                                                  ("authorization", "Bearer secret")))
    seen = oe.fake.seen_params[-1]
    assert seen.trace_headers == {"traceparent": parent, "tracestate": "vendor=x"}
    assert seen.metadata["openengine-routing-key"] == "tenant-7" and seen.metadata["x-app"] == "kept"
    assert "authorization" not in seen.metadata, "credentials never reach the engine"
    # W3C: a malformed traceparent is dropped (the trace restarts), never an error
    await v01_collect(inference, req(), metadata=(("traceparent", "00-zz-00-01"), ("tracestate", "a=b")))
    assert oe.fake.seen_params[-1].trace_headers == {}
    await expect_status(inference.Generate(req(), metadata=(("openengine-routing-key", ""),)),
                        grpc.StatusCode.INVALID_ARGUMENT, "openengine-routing-key")


async def test_extra_known_keys_applied_unknown_ignored_wrong_type_refused(oe):
    inference, _ = stubs(oe)
    r = req()
    r.extra.update({"fake_note": "n", "fake_flag": True, "fake_count": 3, "fake_ids": [1, 2],
                    "someone_elses_key": {"x": 1}})
    await v01_collect(inference, r)
    assert oe.fake.seen_params[-1].extra == {"fake_note": "n", "fake_flag": True, "fake_count": 3,
                                             "fake_ids": [1, 2]}
    for key, value, want in (("fake_flag", "yes", "a boolean"), ("fake_count", 1.5, "an integral number"),
                             ("fake_ids", ["a"], "a list of integral numbers"), ("fake_note", 1, "a string")):
        bad = req()
        bad.extra.update({key: value})
        err = await expect_status(inference.Generate(bad), grpc.StatusCode.INVALID_ARGUMENT, f"extra.{key}", want)
        assert v01_rejection(err).code == v01_error.ERROR_CODE_INVALID_ARGUMENT


async def test_kv_options_renumbered(oe):
    inference, _ = stubs(oe)
    await v01_collect(inference, req(kv=v01_gen.KvOptions(bypass_prefix_cache=True, cache_salt="salt")))
    seen = oe.fake.seen_params[-1]
    assert seen.bypass_prefix_cache is True and seen.cache_salt == "salt" and seen.data_parallel_rank is None
    # an empty salt namespaces nothing: the engine's default on v0.1.0 (issue 24); revision 1 refuses it
    await v01_collect(inference, req(kv=v01_gen.KvOptions(cache_salt="")))
    assert oe.fake.seen_params[-1].cache_salt is None
    err = await expect_status(oe.stub.Generate(gen_request("hi", kv=rev1_kv_options(cache_salt=""))),
                              grpc.StatusCode.INVALID_ARGUMENT, "kv.cache_salt")
    assert rejection(err).code == ErrorCode.INVALID_ARGUMENT


async def test_modality_unspecified_is_not_an_image(oe):
    inference, _ = stubs(oe)
    r = req(media=[v01_gen.MediaItem(data_uri="data:image/png;base64,AAAA")])
    await expect_status(inference.Generate(r), grpc.StatusCode.INVALID_ARGUMENT, "media[0].modality",
                        "MODALITY_UNSPECIFIED")


async def test_load_attributes_keep_json_types(oe):
    _, control = stubs(oe)
    load = await control.GetLoad(v01_server.GetLoadRequest(include_per_rank=True))
    assert json_format.MessageToDict(load.attributes) == {"engine": "fake", "in_flight": 0, "warm": True,
                                                          "ratio": 0.5}
    assert load.HasField("timestamp_unix_nanos") and len(load.ranks) == 1
    assert load.HasField("running_requests") and load.running_requests == 0


async def test_lora_lifecycle_is_shared(oe, tmp_path):
    _, control = stubs(oe)
    (tmp_path / "adapter_config.json").write_text("{}")
    adapter = v01_lora.LoraAdapter(lora_id=7, lora_name="ad", source_path=str(tmp_path))
    loaded = await control.LoadLora(v01_lora.LoadLoraRequest(adapter=adapter))
    assert loaded.adapter.lora_name == "ad" and not loaded.already_loaded
    listed = await oe.stub.ListLoras(lora_pb2.ListLorasRequest())
    assert [a.lora_name for a in listed.adapters] == ["ad"]
    err = await expect_status(control.UnloadLora(v01_lora.UnloadLoraRequest(lora_name="zz")),
                              grpc.StatusCode.NOT_FOUND, "lora_name")
    assert v01_rejection(err).code == v01_error.ERROR_CODE_MODEL_NOT_FOUND
    await control.UnloadLora(v01_lora.UnloadLoraRequest(lora_name="ad"))
    assert not (await control.ListLoras(v01_lora.ListLorasRequest())).adapters


async def test_kv_events_and_sources(oe):
    inference, control = stubs(oe)
    sources = await control.GetKvEventSources(v01_kv.GetKvEventSourcesRequest())
    # one source per rank (Dynamo refuses a rank twice): our own SubscribeKvEvents, preferred by the text
    (native,) = sources.sources
    assert (native.transport, native.encoding, native.topic) == ("grpc", "protobuf",
                                                                 "openengine.v1.Control/SubscribeKvEvents")
    assert (native.endpoint_addr.host, native.endpoint_addr.port) == ("127.0.0.1", oe.server.port)
    assert native.HasField("data_parallel_rank") and native.data_parallel_rank == 0
    rev1 = await oe.stub.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
    (zmq,) = rev1.sources  # revision 1: the engine's own publishers
    assert zmq.transport == "zmq" and zmq.endpoint_addr.host == "127.0.0.1", "wildcards are never advertised"
    sub = control.SubscribeKvEvents(v01_kv.SubscribeKvEventsRequest(include_snapshot=True))
    first = await asyncio.wait_for(sub.read(), 5)
    assert first.WhichOneof("event") == "batch"
    assert first.batch.events[0].WhichOneof("event") == "all_blocks_cleared"
    await v01_collect(inference, req())
    stored = await asyncio.wait_for(sub.read(), 5)
    assert stored.batch.events[0].WhichOneof("event") == "block_stored"
    sub.cancel()


async def test_health(oe):
    _, control = stubs(oe)
    health = await control.Health(v01_life.HealthRequest(include_inference_probe=True))
    assert health.state == v01_life.HEALTH_STATE_READY
    assert any(c.name == "inference_probe" for c in health.checks)
    await expect_status(control.Health(v01_life.HealthRequest(role=9)), grpc.StatusCode.INVALID_ARGUMENT, "role")


@pytest.mark.parametrize("surfaces, present, absent", [
    ("revision-1", "openengine.v1.OpenEngine", "openengine.v1.Inference"),
    ("v0.1.0", "openengine.v1.Inference", "openengine.v1.OpenEngine"),
])
async def test_surfaces_flag_chooses_what_is_served(serve, surfaces, present, absent):
    async with serve({"surfaces": parse_surfaces(surfaces)}) as h:
        inference, control = stubs(h)
        if present == "openengine.v1.Inference":
            assert (await v01_collect(inference, req()))[-1].WhichOneof("event") == "finished"
            await expect_status(h.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest()),
                                grpc.StatusCode.UNIMPLEMENTED)
        else:
            assert (await collect(h.stub, gen_request(stopping={"max_tokens": 2})))[-1].WhichOneof("event")
            await expect_status(control.GetServerInfo(v01_server.GetServerInfoRequest()),
                                grpc.StatusCode.UNIMPLEMENTED)


def test_parse_surfaces():
    assert parse_surfaces(None) == parse_surfaces("both") == ("revision-1", "v0.1.0")
    assert parse_surfaces("v0.1.0, revision-1") == ("v0.1.0", "revision-1")
    with pytest.raises(ValueError, match="v2"):
        parse_surfaces("v2")


def test_error_code_mapping_is_total():
    from openengine_adapters.wire.v0_1.server_mapping import ERROR_CODE

    assert set(ERROR_CODE) == {int(c) for c in ErrorCode}
    assert set(ERROR_CODE.values()) <= set(v01_error.ErrorCode.values())


async def test_an_unmodified_v0_1_client_in_its_own_process(oe):
    """Stubs generated from the canonical, unshifted protos; nothing of this project imported."""
    proc = await asyncio.create_subprocess_exec(*v0_1_client_argv(oe.target, "--expect-engine", "fake"),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "11 passed, 0 failed" in text, text


async def test_a_reflection_only_client_calls_every_service(oe):
    """What grpcurl does: descriptors from server reflection alone, a JSON request, raw bytes on the wire."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    stub = reflection_pb2_grpc.ServerReflectionStub(oe.channel)
    pool, seen = descriptor_pool.DescriptorPool(), set()

    async def load(symbol):
        out = [r async for r in stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol=symbol)]))]
        protos = [descriptor_pb2.FileDescriptorProto.FromString(b)
                  for b in out[0].file_descriptor_response.file_descriptor_proto]
        pending = {p.name: p for p in protos if p.name not in seen}
        while pending:  # add each file after its dependencies
            for name, proto in list(pending.items()):
                if all(d in seen or d not in pending for d in proto.dependency):
                    if proto.name not in seen:
                        pool.Add(proto)
                        seen.add(proto.name)
                    del pending[name]

    calls = {"openengine.v1.Control": ("GetServerInfo", {}),
             "openengine.v1.Inference": ("Generate", {"prompt": "hi", "stopping": {"maxTokens": 2}}),
             "openengine.v1.OpenEngine": ("GetEngineInfo", {})}
    for service, (method, body) in calls.items():
        await load(service)
        desc = pool.FindServiceByName(service).methods_by_name[method]
        request = json_format.ParseDict(body, message_factory.GetMessageClass(desc.input_type)())
        response_class = message_factory.GetMessageClass(desc.output_type)
        path = f"/{service}/{method}"
        kind = oe.channel.unary_stream if desc.server_streaming else oe.channel.unary_unary
        call = kind(path, request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=response_class.FromString)
        if desc.server_streaming:
            out = [json_format.MessageToDict(r) async for r in call(request, timeout=10)]
            assert "finished" in out[-1], out
        else:
            out = json_format.MessageToDict(await call(request, timeout=10))
            assert out["engineName"] == "fake", out


async def test_prefill_accepts_the_decode_legs_output_options_on_v0_1(serve):
    """Dynamo's sidecars send the user's logprob, guided, min_tokens and stop options on the prefill leg
    (TensorRT-LLM's carries the first token's logprob to decode in the handoff): the prefill serves it
    and ends with PrefillReady; min_tokens is capped at the one token a prefill samples. Revision 1
    keeps refusing output logprobs and guided decoding on a PREFILL engine."""
    async with serve(role=EngineRole.PREFILL) as h:
        inference, _ = stubs(h)
        request = v01_gen.GenerateRequest(
            prompt="hi", stopping=v01_gen.StoppingOptions(max_tokens=1, min_tokens=4, conditions=[
                v01_gen.StopCondition(stop_text="."), v01_gen.StopCondition(stop_token_id=5)]),
            response=v01_gen.ResponseOptions(return_output_logprobs=True,
                                             output_candidates=v01_gen.CandidateTokenSelection(top_n=0)),
            guided=v01_gen.GuidedDecoding(choice=v01_gen.ChoiceConstraint(choices=["yes", "no"])))
        events = await v01_collect(inference, request)
        assert [e.WhichOneof("event") for e in events] == ["prefill_ready"]
        seen = h.fake.seen_params[-1]
        assert seen.logprobs.output and seen.guided is not None
        assert seen.stopping.max_tokens == 1 and seen.stopping.min_tokens == 1 and seen.stopping.stop_texts == (".",)
        from openengine_adapters.v1 import generation_pb2 as rev1_gen

        for fields, fragment in ((dict(response=rev1_gen.ResponseOptions(return_output_logprobs=True)),
                                  "return_output_logprobs"),
                                 (dict(guided=rev1_gen.GuidedDecoding(json_object=rev1_gen.JsonObjectConstraint())),
                                  "guided")):
            await expect_status(h.stub.Generate(gen_request("hi", **fields)), grpc.StatusCode.FAILED_PRECONDITION,
                                fragment, "PREFILL")


async def test_decode_without_a_session_is_served_locally_on_v0_1(serve):
    """Conditional disaggregation (Dynamo's TensorRT-LLM sidecar sends short prompts straight to the
    decode worker; TensorRT-LLM's server serves a request without kv.session as a plain one): served
    on v0.1.0; revision 1's role rule still refuses it."""
    async with serve(role=EngineRole.DECODE) as h:
        inference, _ = stubs(h)
        events = await v01_collect(inference, req(max_tokens=3))
        assert events[-1].HasField("finished") and events[-1].usage.completion_tokens == 3
        assert h.fake.seen_params[-1].kv_session is None
        await expect_status(h.stub.Generate(gen_request("hi")), grpc.StatusCode.FAILED_PRECONDITION,
                            "kv.session", "DECODE")


async def test_decode_that_cannot_serve_locally_says_why(serve):
    """An engine whose DECODE role has no local prefill (SGLang: backend.local_decode_refusal) refuses the
    request before acceptance, naming why, and says so in ServerInfo.extra; one that can says "served"."""
    from fake_backend import FakeBackend
    from helpers import serve_backend

    async with serve(role=EngineRole.DECODE) as h:
        info = await stubs(h)[1].GetServerInfo(v01_server.GetServerInfoRequest())
        assert json_format.MessageToDict(info.extra)["decode_without_kv_session"] == "served"
    fake = FakeBackend(role=EngineRole.DECODE)
    fake.local_decode_refusal = "this engine's decode mode has no local prefill"
    async with serve_backend(fake) as h:
        inference, control = stubs(h)
        err = await expect_status(inference.Generate(req()), grpc.StatusCode.FAILED_PRECONDITION,
                                  "kv.session", "no local prefill")
        assert v01_rejection(err).code == v01_error.ERROR_CODE_ROLE_MISMATCH
        info = await control.GetServerInfo(v01_server.GetServerInfoRequest())
        assert json_format.MessageToDict(info.extra)["decode_without_kv_session"].startswith("refused: ")
        assert not fake.seen_params


def test_v0_1_kv_batches_leave_out_vllms_default_cache_kind_that_dynamo_refuses():
    """vLLM 0.32 marks every BlockStored ``kv_cache_spec_kind = "full_attention"``; Dynamo's KV reader
    (ai-dynamo/dynamo lib/sidecar/openengine/src/kv.rs @0cc34d99, ``convert_event``) refuses any kind and
    ends its subscription. On v0.1.0 the default kind is left out; any other kind stays (a hybrid cache)."""
    from openengine_adapters.wire.v0_1 import server_mapping

    resp = kv_pb2.SubscribeKvEventsResponse()
    for kind, window in (("full_attention", 0), ("sliding_window", 128), ("full_attention", 64), ("", 0)):
        resp.batch.events.add().block_stored.CopyFrom(kv_pb2.BlockStored(
            block_size=32, kv_cache_spec_kind=kind, kv_cache_spec_sliding_window=window))
    resp.batch.events.add().block_removed.SetInParent()
    out = server_mapping.kv_events_batch(resp)
    assert [(e.block_stored.kv_cache_spec_kind, e.block_stored.kv_cache_spec_sliding_window)
            for e in out.batch.events if e.HasField("block_stored")] == \
        [("", 0), ("sliding_window", 128), ("full_attention", 64), ("", 0)]
    assert out.batch.events[-1].HasField("block_removed")


async def test_kv_block_hash_encoding_decimal_int64_is_what_v0_1_sends_when_asked(serve, monkeypatch):
    """``--kv-block-hash-encoding decimal_int64`` (plugins: ``OPENENGINE_KV_BLOCK_HASH_ENCODING``): the v0.1.0
    stream carries each int64 block hash as the decimal Dynamo's KV reader parses (kv.rs ``block_hash``
    @0cc34d99); revision 1 keeps the engine's bytes. The default stays upstream's ``int64``."""
    import argparse

    from openengine_adapters.server_config import add_server_args, plugin_server_config, server_config_from_args

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert server_config_from_args(parser.parse_args([])).kv_block_hash_encoding == "int64"
    assert server_config_from_args(parser.parse_args(["--kv-block-hash-encoding", "decimal_int64"])
                                   ).kv_block_hash_encoding == "decimal_int64"
    monkeypatch.setenv("OE_TEST_PORT", "0")
    monkeypatch.setenv("OPENENGINE_KV_BLOCK_HASH_ENCODING", "decimal_int64")
    assert plugin_server_config("OE_TEST_PORT", "H", "M").kv_block_hash_encoding == "decimal_int64"
    monkeypatch.setenv("OPENENGINE_KV_BLOCK_HASH_ENCODING", "decimal")
    with pytest.raises(ValueError, match="kv_block_hash_encoding"):
        plugin_server_config("OE_TEST_PORT", "H", "M")

    async with serve(config={"kv_block_hash_encoding": "decimal_int64"}) as h:
        inference, control = stubs(h)
        v01 = control.SubscribeKvEvents(v01_kv.SubscribeKvEventsRequest(include_snapshot=True))
        rev1 = h.stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True))
        for sub in (v01, rev1):  # the snapshot comes first: both subscriptions are registered
            assert (await asyncio.wait_for(sub.read(), 5)).batch.events[0].HasField("all_blocks_cleared")
        await v01_collect(inference, req())
        mine, theirs = (await asyncio.wait_for(v01.read(), 5)).batch, (await asyncio.wait_for(rev1.read(), 5)).batch
        v01.cancel()
        rev1.cancel()
    (stored,) = [e.block_stored for e in mine.events if e.HasField("block_stored")]
    (engine,) = [e.block_stored for e in theirs.events if e.HasField("block_stored")]
    assert engine.block_hashes and [h.encoding for h in engine.block_hashes] == ["int64"] * len(engine.block_hashes)
    assert [(h.encoding, h.value) for h in stored.block_hashes] == \
        [("decimal_int64", str(int.from_bytes(h.value, "big", signed=True)).encode()) for h in engine.block_hashes]
