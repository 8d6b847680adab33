"""Disaggregated prefill/decode between two REAL vLLM sidecars over NIXL (UCX on CPU).

Two ``python -m openengine_adapters.vllm`` processes, one ``--role prefill`` (NixlConnector,
kv_producer) and one decode (kv_consumer), hand KV off through OpenEngine sessions: the KV
really crosses between the processes (the decode side's NIXL stats report the bytes), and
the decoded tokens equal transformers' greedy continuation of the same prompt.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import pytest_asyncio
from google.protobuf import json_format
from helpers import collect, eventually, expect_status, free_port, rejection, run_v0_1_client, v0_1_conformance
from sidecar import drain_output, launch, stop
from stream_contract import check_generate_stream

from conformance import run_suite_async
from openengine_adapters.types import ErrorCode
from openengine_adapters.v1 import engine_pb2, input_pb2, kv_pb2, lifecycle_pb2, model_pb2, openengine_pb2_grpc
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import observability_pb2 as obs
from openengine_adapters.wire.v0_1.stub import V01Stub

pytestmark = pytest.mark.asyncio(loop_scope="session")

LEASE_S = 40  # kv_lease_duration: how long the prefill side keeps handed-off KV
PROMPT = list(range(5, 300))  # 295 tokens: three 128-token blocks on CPU


def engine_flags(model_dir, kv_role: str) -> list[str]:
    kv = {"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cpu",
          "kv_connector_extra_config": {"kv_lease_duration": LEASE_S}}
    return ["--model", str(model_dir), "--served-model-name", "tiny", "--max-model-len", "512",
            "--enforce-eager", "--gpu-memory-utilization", "0.2", "--dtype", "float32", "--seed", "0",
            "--kv-transfer-config", json.dumps(kv)]


class Side:
    def __init__(self, proc, target, side_port):
        self.proc, self.target, self.side_port = proc, target, side_port
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = openengine_pb2_grpc.OpenEngineStub(self.channel)
        self.reader = asyncio.ensure_future(drain_output(proc))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pd(model_dir):
    ports = free_port(), free_port()
    starts = [launch(*engine_flags(model_dir, role), *extra,
                     env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)})
              for role, extra, port in (("kv_producer", ["--role", "prefill"], ports[0]),
                                        ("kv_consumer", [], ports[1]))]  # decode: implied by kv_role
    results = await asyncio.gather(*starts, return_exceptions=True)
    procs = [r[0] for r in results if not isinstance(r, BaseException)]
    try:
        for r in results:
            if isinstance(r, BaseException):
                raise r
        sides = [Side(proc, target, port) for (proc, target, _), port in zip(results, ports, strict=True)]
        yield sides
        for s in sides:
            await s.channel.close()
            s.reader.cancel()
    finally:
        for proc in procs:
            await stop(proc)


@pytest.fixture
def prefill(pd):
    return pd[0]


@pytest.fixture
def decode(pd):
    return pd[1]


def ids(tokens):
    return input_pb2.TokenIds(ids=tokens)


async def do_prefill(prefill, tokens=PROMPT, request_id=None, **kw) -> kv_pb2.KvSessionRef:
    req = g.GenerateRequest(token_ids=ids(tokens), request_id=request_id or "", **kw)
    events = await collect(prefill.stub, req, timeout=60)
    check_generate_stream(req, events, prefill=True)
    (ready,) = events
    assert ready.WhichOneof("event") == "prefill_ready"
    assert ready.usage.prompt_tokens == len(tokens) and ready.usage.completion_tokens == 0
    return ready.prefill_ready.kv_session


def decode_request(session, tokens=PROMPT, max_tokens=8):
    return g.GenerateRequest(token_ids=ids(tokens), sampling=g.SamplingParams(temperature=0.0),
                             stopping=g.StoppingOptions(max_tokens=max_tokens, ignore_eos=True),
                             kv=g.KvOptions(session=session))


def tampered(session, **changes) -> kv_pb2.KvSessionRef:
    attrs = json_format.MessageToDict(session.attributes_struct)
    for key, value in changes.items():
        if key in ("prompt_digest", "expires_unix_ms"):
            attrs[key] = value
        else:
            attrs["kv_transfer_params"][key] = value
    out = kv_pb2.KvSessionRef()
    out.CopyFrom(session)
    out.attributes_struct.Clear()
    out.attributes_struct.update(attrs)
    return out


async def test_roles_and_connector_are_reported(prefill, decode, model_dir):
    for side, role in ((prefill, engine_pb2.ENGINE_ROLE_PREFILL), (decode, engine_pb2.ENGINE_ROLE_DECODE)):
        info = await side.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
        assert info.role == role
        conn = await side.stub.GetKvConnectorInfo(kv_pb2.GetKvConnectorInfoRequest())
        assert conn.enabled and conn.transfer_backend == "nixl" and conn.schema_version > 0
        assert [(e.host, e.port, e.protocol) for e in conn.local_endpoints] == [("127.0.0.1", side.side_port, "nixl")]
        assert conn.supports_remote_prefill == (role == engine_pb2.ENGINE_ROLE_DECODE)
        assert conn.HasField("supports_abort_cleanup") and not conn.supports_abort_cleanup
    model = await prefill.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    assert model.generation.max_num_sequences == 1


async def test_handoff_decodes_the_aggregated_greedy_continuation(prefill, decode, reference):
    events = decode.stub.SubscribeRuntimeEvents(obs.SubscribeRuntimeEventsRequest(
        types=[obs.RUNTIME_EVENT_TYPE_TRANSFER]))
    session = await do_prefill(prefill)
    assert session.transfer_backend == "nixl" and session.session_id
    assert [(e.host, e.port) for e in session.endpoints] == [("127.0.0.1", prefill.side_port)]
    attrs = session.attributes_struct
    params = attrs["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_port"] == prefill.side_port
    assert [len(group) for group in params["remote_block_ids"]] == [3]  # 295 tokens / 128 per block
    assert attrs["prompt_tokens"] == len(PROMPT)

    req = decode_request(session)
    s = check_generate_stream(req, await collect(decode.stub, req, timeout=60))
    assert s.token_ids[0] == reference.greedy(PROMPT, 8)

    seen, moved = set(), 0
    async with asyncio.timeout(30):
        async for msg in events:
            attrs = msg.runtime_event.attributes
            seen.add(attrs["phase"])
            moved += int(attrs.get("bytes_transferred", 0))
            if {"decode_started", "decode_loaded"} <= seen and moved:
                break
    events.cancel()
    assert moved > 0  # NIXL read the prefill engine's blocks


async def test_text_prompt_handoff(prefill, decode, reference):
    text = "the quick brown fox " * 20
    req = g.GenerateRequest(prompt=text)
    s = check_generate_stream(req, await collect(prefill.stub, req, timeout=60), prefill=True)
    session = s.prefill_ready.kv_session
    dreq = g.GenerateRequest(prompt=text, sampling=g.SamplingParams(temperature=0.0),
                             stopping=g.StoppingOptions(max_tokens=4, ignore_eos=True), kv=g.KvOptions(session=session))
    s = check_generate_stream(dreq, await collect(decode.stub, dreq, timeout=60))
    assert s.token_ids[0] == reference.greedy(reference.tokenizer(text)["input_ids"], 4)


async def test_prefill_streams_prompt_logprobs_before_the_session(prefill, reference):
    tokens = PROMPT[:40]
    req = g.GenerateRequest(token_ids=ids(tokens), response=g.ResponseOptions(return_prompt_logprobs=True))
    responses = await collect(prefill.stub, req, timeout=60)
    s = check_generate_stream(req, responses, prefill=True)
    assert [r.WhichOneof("event") for r in responses] == ["prompt", "prefill_ready"]
    expected = reference.logprobs(tokens)
    got = [t.logprob for t in s.prompt.tokens[1:]]
    want = [float(expected[i - 1][tokens[i]]) for i in range(1, len(tokens))]
    assert got == pytest.approx(want, abs=1e-3)


async def test_a_session_decodes_once(prefill, decode):
    session = await do_prefill(prefill)
    await collect(decode.stub, decode_request(session, max_tokens=2), timeout=60)
    err = await expect_status(decode.stub.Generate(decode_request(session)), grpc.StatusCode.NOT_FOUND,
                              "already decoded")
    assert rejection(err).code == ErrorCode.KV_SESSION_NOT_FOUND


async def test_decode_of_another_prompt_is_refused_before_acceptance(prefill, decode, reference):
    session = await do_prefill(prefill)
    other = [t + 1 for t in PROMPT]
    await expect_status(decode.stub.Generate(decode_request(session, other)), grpc.StatusCode.INVALID_ARGUMENT,
                        "prompt_digest")
    await expect_status(decode.stub.Generate(decode_request(session, PROMPT[:100])),
                        grpc.StatusCode.INVALID_ARGUMENT, "100 prompt tokens", "295")
    req = decode_request(session, max_tokens=3)  # the refused attempts did not use the session up
    s = check_generate_stream(req, await collect(decode.stub, req, timeout=60))
    assert s.token_ids[0] == reference.greedy(PROMPT, 3)


async def test_foreign_or_expired_sessions_are_refused(prefill, decode):
    session = await do_prefill(prefill)
    foreign = kv_pb2.KvSessionRef()
    foreign.CopyFrom(session)
    foreign.transfer_backend = "mooncake"
    await expect_status(decode.stub.Generate(decode_request(foreign)), grpc.StatusCode.INVALID_ARGUMENT,
                        "kv.session.transfer_backend")
    bare = kv_pb2.KvSessionRef(session_id="made-up", transfer_backend="nixl")
    await expect_status(decode.stub.Generate(decode_request(bare)), grpc.StatusCode.INVALID_ARGUMENT,
                        "kv_transfer_params: required")
    await expect_status(decode.stub.Generate(decode_request(tampered(session, remote_port="x"))),
                        grpc.StatusCode.INVALID_ARGUMENT, "kv_transfer_params.remote_port")
    err = await expect_status(decode.stub.Generate(decode_request(tampered(session, expires_unix_ms=1000))),
                              grpc.StatusCode.NOT_FOUND, "expired")
    assert rejection(err).code == ErrorCode.KV_SESSION_NOT_FOUND


@pytest.mark.parametrize("corruption", [{"remote_block_ids": [[9000, 9001, 9002]]},
                                        {"remote_engine_id": "not-the-prefill-engine"}])
async def test_corrupted_session_fails_with_one_kv_transfer_error(prefill, decode, corruption):
    session = tampered(await do_prefill(prefill), **corruption)
    req = decode_request(session)
    events = await collect(decode.stub, req, timeout=60)
    check_generate_stream(req, events)
    assert [e.WhichOneof("event") for e in events] == ["error"]
    assert events[0].error.code == ErrorCode.KV_TRANSFER_FAILED
    health = await decode.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True,
                                                                  role=engine_pb2.ENGINE_ROLE_DECODE))
    assert health.state == lifecycle_pb2.HEALTH_STATE_READY  # the engine survived it


async def test_role_rules_are_checked_before_acceptance(prefill, decode):
    await expect_status(decode.stub.Generate(g.GenerateRequest(token_ids=ids(PROMPT))),
                        grpc.StatusCode.FAILED_PRECONDITION, "kv.session")
    await expect_status(prefill.stub.Generate(g.GenerateRequest(
        token_ids=ids(PROMPT), stopping=g.StoppingOptions(max_tokens=5))),
        grpc.StatusCode.FAILED_PRECONDITION, "stopping.max_tokens")


DECODE_LEG_OPTIONS = dict(  # what Dynamo's sidecars send on both legs of a disaggregated request
    response=g.ResponseOptions(return_output_logprobs=True, output_candidates=g.CandidateTokenSelection(top_n=2)),
    guided=g.GuidedDecoding(choice=g.ChoiceConstraint(choices=["alpha", "beta"])))


async def test_v0_1_prefill_takes_the_decode_legs_options_and_the_decode_honours_them(prefill, decode):
    """Issue 24: on v0.1.0 a prefill request may carry the user's output logprobs, guided decoding, min_tokens
    and stops (Dynamo's sidecars send them on the prefill leg); vLLM's decode engine recomputes the last
    prompt token and samples the first output itself, so the decode leg's output honours them."""
    pre = g.GenerateRequest(token_ids=ids(PROMPT), stopping=g.StoppingOptions(
        max_tokens=1, min_tokens=3, conditions=[g.StopCondition(stop_token_id=7), g.StopCondition(stop_text="x")]),
        **DECODE_LEG_OPTIONS)
    events = await collect(V01Stub(prefill.channel), pre, timeout=60)
    check_generate_stream(pre, events, prefill=True)
    session = events[-1].prefill_ready.kv_session
    dec = g.GenerateRequest(token_ids=ids(PROMPT), kv=g.KvOptions(session=session),
                            sampling=g.SamplingParams(temperature=0.0), stopping=g.StoppingOptions(max_tokens=16),
                            **DECODE_LEG_OPTIONS)
    s = check_generate_stream(dec, await collect(V01Stub(decode.channel), dec, timeout=60))  # logprobs per token
    assert s.text[0] in ("alpha", "beta")
    # revision 1 keeps its role rule (a request without min_tokens: there min_tokens 3 > max_tokens 1 is refused first)
    await expect_status(prefill.stub.Generate(g.GenerateRequest(token_ids=ids(PROMPT), **DECODE_LEG_OPTIONS)),
                        grpc.StatusCode.FAILED_PRECONDITION, "PREFILL")


async def test_v0_1_decode_without_a_session_serves_it_locally(decode, reference):
    """Conditional disaggregation: a short prompt sent straight to the decode worker is served there."""
    req = g.GenerateRequest(token_ids=ids(PROMPT[:40]), sampling=g.SamplingParams(temperature=0.0),
                            stopping=g.StoppingOptions(max_tokens=6, ignore_eos=True))
    s = check_generate_stream(req, await collect(V01Stub(decode.channel), req, timeout=60))
    assert s.token_ids[0] == reference.greedy(PROMPT[:40], 6)


async def test_health_probes_both_roles(prefill, decode):
    for side, role in ((prefill, engine_pb2.ENGINE_ROLE_PREFILL), (decode, engine_pb2.ENGINE_ROLE_DECODE)):
        health = await side.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True, role=role))
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY, health


async def test_sessions_are_tracked_and_aborted_by_session(prefill, decode):
    before = (await prefill.stub.GetLoad(obs.GetLoadRequest())).active_kv_sessions
    session = await do_prefill(prefill, request_id="tracked-prefill")
    assert session.session_id == "tracked-prefill"
    assert (await prefill.stub.GetLoad(obs.GetLoadRequest())).active_kv_sessions == before + 1
    resp = await prefill.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=session))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    assert (await prefill.stub.GetLoad(obs.GetLoadRequest())).active_kv_sessions == before
    err = await expect_status(prefill.stub.Abort(lifecycle_pb2.AbortRequest(
        kv_session=kv_pb2.KvSessionRef(session_id="never-handed-off"))), grpc.StatusCode.NOT_FOUND)
    assert rejection(err).code == ErrorCode.KV_SESSION_NOT_FOUND

    # decode side: Abort(kv_session) stops the generation attached to it
    session = await do_prefill(prefill)
    call = decode.stub.Generate(decode_request(session, max_tokens=200))
    first = await call.read()
    assert first.WhichOneof("event") == "token"
    assert (await decode.stub.GetLoad(obs.GetLoadRequest())).active_kv_sessions == 1
    resp = await decode.stub.Abort(lifecycle_pb2.AbortRequest(kv_session=session))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    rest = [r async for r in _rest(call)]
    assert rest[-1].finished.reason == g.FINISH_REASON_CANCELLED
    load = await decode.stub.GetLoad(obs.GetLoadRequest())
    assert load.active_kv_sessions == 0
    async def idle():  # vLLM's own count settles with its next step
        return (await decode.stub.GetLoad(obs.GetLoadRequest())).running_requests == 0
    await eventually(idle, timeout=5, interval=0.1, message="decode engine still runs a request")


async def _rest(call):
    while (r := await call.read()) is not grpc.aio.EOF:
        yield r


async def test_conformance_suite_on_prefill_and_decode(prefill, decode):
    for side in (prefill, decode):
        report = await run_suite_async(side.target, "tiny", check_timeout_s=120)
        print(report.table())
        assert not report.failures(), [(r.name, r.reason) for r in report.failures()]
        assert report.passed >= 20
        await v0_1_conformance(side.target, "tiny", check_timeout_s=120)
        await run_v0_1_client(side.target, "--model", "tiny", "--expect-engine", "vllm")


async def test_zz_drain_forgets_open_sessions_at_its_deadline(prefill):
    """Near the end: the prefill keeps accepting work (stop_accepting_new_requests false) for the
    last test, which kills it."""
    await do_prefill(prefill)
    events = [e async for e in prefill.stub.Drain(lifecycle_pb2.DrainRequest(
        stop_accepting_new_requests=False, deadline_ms=1500, abort_after_deadline=True))]
    assert events[0].open_kv_sessions >= 1
    assert events[-1].state == lifecycle_pb2.DRAIN_STATE_COMPLETE and events[-1].open_kv_sessions == 0


async def test_zzz_killing_the_prefill_sidecar_mid_handoff_ends_the_decode_once_and_frees_it(prefill, decode):
    """Last (issue 25, item 4): the prefill sidecar is SIGKILLed (with its engine core) between handing
    a session off and the decode pulling its KV. The decode request ends with exactly one terminal
    KV_TRANSFER_FAILED error, within a bound (no hang), its engine runs nothing afterwards and still
    serves, and the session cannot be decoded again."""
    import psutil

    session = await do_prefill(prefill)
    victims = [psutil.Process(prefill.proc.pid), *psutil.Process(prefill.proc.pid).children(recursive=True)]
    for p in victims:
        p.kill()
    await asyncio.wait_for(prefill.proc.wait(), 30)
    psutil.wait_procs(victims, timeout=10)
    req = decode_request(session)
    started = asyncio.get_running_loop().time()
    events = await collect(decode.stub, req, timeout=120)
    took = asyncio.get_running_loop().time() - started
    print(f"decode after the prefill sidecar died: {events[-1].WhichOneof('event')} after {took:.1f} s")
    check_generate_stream(req, events)
    errors = [e.error for e in events if e.HasField("error")]
    assert len(errors) == 1 and events[-1].HasField("error"), events
    assert errors[0].code == ErrorCode.KV_TRANSFER_FAILED, errors[0]
    assert not errors[0].retryable, errors[0]  # the unchanged decode cannot succeed (docs/lifecycle.md)

    async def idle():
        load = await decode.stub.GetLoad(obs.GetLoadRequest())
        return load.running_requests == 0

    await eventually(idle, timeout=30)
    await expect_status(decode.stub.Generate(decode_request(session)), grpc.StatusCode.NOT_FOUND, "session")
    health = await decode.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True,
                                                                  role=engine_pb2.ENGINE_ROLE_DECODE))
    assert health.state == lifecycle_pb2.HEALTH_STATE_READY
