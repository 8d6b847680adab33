"""Bad input answered right, on both surfaces: bytes that do not decode, a prompt_logprob_start past
a text prompt, input echoed into messages, long request ids, the finished-id memory, and token-id
prompts longer than the model's context."""

from __future__ import annotations

import grpc
from google.protobuf import message_factory
from helpers import collect, expect_status, gen_request, rejection

from openengine_adapters.core.live_requests import ENTRY_OVERHEAD_BYTES, RequestRegistry
from openengine_adapters.errors import ERROR_TRAILER, MAX_MESSAGE_BYTES
from openengine_adapters.v0_1 import error_pb2 as v01_error_pb2
from openengine_adapters.v0_1 import openengine_pb2 as v01_openengine_pb2
from openengine_adapters.v1 import (
    error_pb2,
    generation_pb2,
    input_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    openengine_pb2,
)
from openengine_adapters.validation.ids import MAX_REQUEST_ID_BYTES
from openengine_adapters.wire.v0_1.stub import V01Stub

INVALID = grpc.StatusCode.INVALID_ARGUMENT
# a length-delimited field 1 that claims 127 bytes and has 1; a bare varint tag with no value; a group end
GARBAGE = (b"\x0a\x7f\x00", b"\x08", b"\x0c")


def methods():
    """(full method name, server streaming, the surface's EngineError type) of every RPC served."""
    for pb2, services, error in ((openengine_pb2, ("OpenEngine",), error_pb2.EngineError),
                                 (v01_openengine_pb2, ("Inference", "Control"), v01_error_pb2.EngineError)):
        for name in services:
            service = pb2.DESCRIPTOR.services_by_name[name]
            for m in service.methods:
                yield f"/{service.full_name}/{m.name}", m.server_streaming, error, m.input_type


async def test_undecodable_bytes_are_invalid_argument_with_the_surfaces_trailer_on_every_rpc(oe):
    seen = 0
    for method, streaming, error_type, input_type in methods():
        for data in GARBAGE:
            try:
                message_factory.GetMessageClass(input_type).FromString(data)
                continue  # these bytes happen to decode for this message
            except Exception:
                pass
            call = (oe.channel.unary_stream if streaming else oe.channel.unary_unary)(method)(data, timeout=5)
            try:
                if streaming:
                    events = [r async for r in call]
                    raise AssertionError(f"{method} answered {len(events)} messages to undecodable bytes")
                await call
                raise AssertionError(f"{method} accepted undecodable bytes")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == INVALID, (method, exc.code(), exc.details())
                raw = [v for k, v in exc.trailing_metadata() if k == ERROR_TRAILER]
                assert raw, f"{method}: no {ERROR_TRAILER} trailer"
                err = error_type.FromString(raw[0])
                assert err.code == 1 and err.message == exc.details() and not err.retryable  # INVALID_ARGUMENT
                assert input_type.name in err.message
                seen += 1
    assert seen >= 3 * (17 + 11) - 3, seen
    assert oe.service.lifecycle.accepting  # Drain's garbage never started a drain


async def test_a_text_prompt_shorter_than_prompt_logprob_start_ends_with_one_error_not_an_empty_event(oe):
    for stub in (oe.stub, V01Stub(oe.channel)):
        req = gen_request("hello there", stopping=generation_pb2.StoppingOptions(max_tokens=2),
                          response=generation_pb2.ResponseOptions(return_prompt_logprobs=True,
                                                                  prompt_logprob_start=1000))
        responses = await collect(stub, req)
        assert all(r.WhichOneof("event") for r in responses), f"a response without an event: {responses}"
        assert len(responses) == 1 and responses[0].error.code == error_pb2.ERROR_CODE_INVALID_ARGUMENT
        assert "prompt_logprob_start: 1000 is not a prompt position" in responses[0].error.message
        req.response.prompt_logprob_start = 1
        assert (await collect(stub, req))[0].HasField("prompt")
    assert len(oe.service.registry) == 0 and oe.service.admission.in_flight == 0


async def test_echoed_input_is_truncated_so_the_real_status_reaches_the_client(oe):
    huge = "x" * 20000
    calls = [
        (lambda stub: stub.GetModelInfo(model_pb2.GetModelInfoRequest(model=huge)), grpc.StatusCode.NOT_FOUND),
        (lambda stub: stub.Abort(lifecycle_pb2.AbortRequest(request_id=huge)), grpc.StatusCode.NOT_FOUND),
        (lambda stub: stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
            lora_id=1, lora_name="a", source_path="/" + huge))), INVALID),
        (lambda stub: stub.Generate(gen_request("hi", model=huge)), grpc.StatusCode.NOT_FOUND),
    ]
    for stub in (oe.stub, V01Stub(oe.channel)):
        for make, code in calls:
            exc = await expect_status(make(stub), code)
            assert len(exc.details().encode()) <= MAX_MESSAGE_BYTES and "more bytes]" in exc.details()
            assert rejection(exc).message == exc.details()


async def test_request_ids_over_the_documented_length_are_refused(oe):
    ok = "r" * MAX_REQUEST_ID_BYTES
    assert (await collect(oe.stub, gen_request("hi", request_id=ok)))[-1].HasField("finished")
    assert (await oe.stub.Abort(lifecycle_pb2.AbortRequest(request_id=ok))).status == \
        lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED
    for stub in (oe.stub, V01Stub(oe.channel)):
        for too_long in ("r" * (MAX_REQUEST_ID_BYTES + 1), "é" * (MAX_REQUEST_ID_BYTES // 2 + 1)):
            exc = await expect_status(stub.Generate(gen_request("hi", request_id=too_long)), INVALID,
                                      f"request ids are at most {MAX_REQUEST_ID_BYTES} bytes")
            assert rejection(exc).code == error_pb2.ERROR_CODE_INVALID_ARGUMENT


def test_finished_id_memory_is_bounded_in_bytes():
    budget = 64 * 1024
    registry = RequestRegistry(finished_capacity=1_000_000, finished_bytes=budget)
    ids = [f"{i:08d}-" + "z" * 200 for i in range(1000)]  # 209 bytes each: ~300 fit in 64 KiB
    for rid in ids:
        registry.complete(registry.register(rid))
    assert registry.finished_bytes <= budget
    kept = [rid for rid in ids if registry.is_finished(rid)]
    assert kept == ids[-len(kept):] and len(kept) == budget // (209 + ENTRY_OVERHEAD_BYTES)
    registry.complete(registry.register(ids[-1]))  # finishing an id again does not count it twice
    assert registry.finished_bytes == len(kept) * (209 + ENTRY_OVERHEAD_BYTES)


async def test_token_id_prompts_longer_than_max_context_length_are_refused_before_acceptance(oe):
    limit = 512  # the fake card's max_context_length
    for stub in (oe.stub, V01Stub(oe.channel)):
        too_long = generation_pb2.GenerateRequest(token_ids=input_pb2.TokenIds(ids=[5] * (limit + 1)),
                                                  stopping=generation_pb2.StoppingOptions(max_tokens=1))
        await expect_status(stub.Generate(too_long), INVALID, f"{limit + 1} tokens", f"max_context_length {limit}")
        fits = generation_pb2.GenerateRequest(token_ids=input_pb2.TokenIds(ids=[5] * limit),
                                              stopping=generation_pb2.StoppingOptions(max_tokens=1))
        assert (await collect(stub, fits))[-1].HasField("finished")
