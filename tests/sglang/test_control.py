"""Control plane on the REAL SGLang engine: abort (id / all), client cancellation, health probe,
load, engine/model info. "Stopped" means SGLang's own running + waiting count is back to zero."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from conftest import PAGE_SIZE, running_requests
from helpers import collect, eventually, read_rest

from openengine_adapters.v1 import engine_pb2, lifecycle_pb2, model_pb2, observability_pb2
from openengine_adapters.v1 import generation_pb2 as g

pytestmark = pytest.mark.asyncio(loop_scope="session")


def long_req(rid, n=1):
    r = g.GenerateRequest(request_id=rid, model="tiny", prompt="the cat sees the dog")
    r.stopping.max_tokens = 1900
    r.stopping.ignore_eos = True
    r.sampling.temperature = 0.0
    r.sampling.num_sequences = n
    return r


async def wait_idle(served, timeout=20.0):
    async def idle() -> bool:
        return await running_requests(served.tm) == 0 and not served.backend._live

    await eventually(idle, timeout, 0.1, "SGLang still runs a request, or the adapter still holds one")


async def until_running(served, at_least=1, timeout=10.0):
    """SGLang publishes its load snapshot on prefill and every 15 decode steps (and when idle)."""
    async def running() -> bool:
        return await running_requests(served.tm) >= at_least

    await eventually(running, timeout, 0.05, "SGLang never reported the request running")


async def first_token(call):
    while True:
        r = await call.read()
        if r.WhichOneof("event") == "token":
            return r


@pytest.mark.parametrize("n", [1, 3])
async def test_abort_by_id_stops_sglang(served, n):
    call = served.stub.Generate(long_req(f"abort-{n}", n))
    await first_token(call)
    await until_running(served)
    resp = await served.stub.Abort(lifecycle_pb2.AbortRequest(request_id=f"abort-{n}"))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    rest = await read_rest(call)
    fins = [r.finished for r in rest if r.WhichOneof("event") == "finished"]
    assert sorted(f.output_index for f in fins) == list(range(n))
    assert all(f.reason == g.FINISH_REASON_CANCELLED for f in fins)
    assert rest[-1].HasField("usage") and rest[-1].usage.completion_tokens < 1900 * n
    await wait_idle(served)
    again = await served.stub.Abort(lifecycle_pb2.AbortRequest(request_id=f"abort-{n}"))
    assert again.status == lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED


async def test_abort_all(served):
    calls = [served.stub.Generate(long_req(f"all-{i}")) for i in range(2)]
    for c in calls:
        await first_token(c)
    resp = await served.stub.Abort(lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests()))
    assert resp.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    for c in calls:
        rest = await read_rest(c)
        assert rest[-1].finished.reason == g.FINISH_REASON_CANCELLED
    await wait_idle(served)


@pytest.mark.parametrize("n", [1, 2])
async def test_client_cancel_stops_sglang(served, n):
    call = served.stub.Generate(long_req(f"cancel-{n}", n))
    await first_token(call)
    await until_running(served)
    call.cancel()
    await wait_idle(served)


async def test_deadline_stops_sglang(served):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await collect(served.stub, long_req("deadline"), timeout=1.5)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_idle(served)


async def test_abort_does_not_touch_other_requests(served):
    """rids cannot prefix each other: aborting "x" leaves "x1" (and "x" with n=10's index 1 vs 10) running."""
    call_a = served.stub.Generate(long_req("x"))
    b = long_req("x1")
    b.stopping.max_tokens = 24
    call_b = served.stub.Generate(b)
    await first_token(call_a)
    await first_token(call_b)
    await served.stub.Abort(lifecycle_pb2.AbortRequest(request_id="x"))
    rest_b = await read_rest(call_b)
    assert rest_b[-1].finished.reason == g.FINISH_REASON_LENGTH
    rest_a = await read_rest(call_a)
    assert rest_a[-1].finished.reason == g.FINISH_REASON_CANCELLED
    await wait_idle(served)


async def test_health_with_real_inference_probe(served):
    before = served.tm.last_receive_tstamp
    resp = await served.stub.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True))
    assert resp.state == lifecycle_pb2.HEALTH_STATE_READY
    checks = {c.name: c for c in resp.checks}
    assert checks["inference_probe"].state == lifecycle_pb2.HEALTH_STATE_READY
    assert checks["scheduler"].state == lifecycle_pb2.HEALTH_STATE_READY
    assert served.tm.last_receive_tstamp > before  # the probe really went through SGLang
    await wait_idle(served)


async def test_load_reports_sglang_pages(served):
    idle = await served.stub.GetLoad(observability_pb2.GetLoadRequest(include_per_rank=True))
    assert idle.running_requests == 0 and idle.queued_requests == 0
    assert idle.total_kv_blocks == 8192 // PAGE_SIZE
    (rank,) = idle.ranks
    assert rank.data_parallel_rank == 0 and rank.total_kv_blocks == 8192 // PAGE_SIZE
    call = served.stub.Generate(long_req("load"))
    await first_token(call)
    # counted the moment it is in flight, before SGLang's next published snapshot (issue 24)
    assert (await served.stub.GetLoad(observability_pb2.GetLoadRequest())).running_requests == 1
    await until_running(served)
    busy = await served.stub.GetLoad(observability_pb2.GetLoadRequest())
    assert busy.running_requests == 1
    assert busy.used_kv_blocks >= 2  # prompt + generated tokens in 4-token pages
    assert busy.HasField("timestamp_unix_nanos")
    call.cancel()
    await wait_idle(served)


async def test_engine_and_model_info(served):
    info = await served.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert info.engine_name == "sglang" and info.engine_version.startswith("0.5.")
    assert info.role == engine_pb2.ENGINE_ROLE_AGGREGATED and list(info.supported_models) == ["tiny"]
    mi = await served.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    assert mi.max_context_length == 2048 and mi.kv_block_size == PAGE_SIZE
    assert mi.total_kv_blocks == 8192 // PAGE_SIZE
    gen = mi.generation
    assert gen.max_num_sequences == 16 and gen.supports_stop_in_output and gen.supports_cache_salt
    assert gen.HasField("supports_prefix_cache_bypass") and not gen.supports_prefix_cache_bypass
    assert gen.supports_priority
    assert gen.guided_decoding.supported and len(gen.guided_decoding.modes) == 6
    assert not mi.supports_lora and not mi.supports_multimodal
    assert mi.tasks.score.supports_label_token_scoring
    assert not mi.tasks.HasField("embed") and not mi.tasks.HasField("classify")


async def test_model_info_agrees_with_manifest(served):
    from manifest_check import check_manifest

    mi = await served.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    guided = {f"generate.guided.{m}" for m in ("json_schema", "regex", "ebnf_grammar", "structural_tag", "choice",
                                                "json_object")}
    checked = check_manifest(mi, {"generate.cache_salt", "score.label_tokens", "generate.priority", *guided},
                             engine="sglang")
    assert checked >= 25


async def test_runtime_events_batch_and_queue_from_load_snapshots(served):
    """BATCH / QUEUE from polls of SGLang's load snapshots (no FORWARD_PASS: SGLang has no
    per-step source the tokenizer process can see)."""
    events = served.stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest(
        types=[observability_pb2.RUNTIME_EVENT_TYPE_BATCH, observability_pb2.RUNTIME_EVENT_TYPE_QUEUE]))
    call = served.stub.Generate(g.GenerateRequest(
        request_id="rt-events", model="tiny", prompt="the cat sees the dog",
        stopping=g.StoppingOptions(max_tokens=64, ignore_eos=True)))
    busy, queue_seen, types = None, False, set()
    async with asyncio.timeout(30):
        async for msg in events:
            ev = msg.runtime_event
            types.add(ev.type)
            attrs = dict(ev.attributes)
            assert attrs["data_parallel_rank"] == "0" and ev.event_id.startswith("sglang-")
            if ev.type == observability_pb2.RUNTIME_EVENT_TYPE_QUEUE:
                queue_seen = True
            elif int(attrs["running_requests"]) >= 1:
                busy = attrs
            if busy is not None and queue_seen:
                break
    events.cancel()
    assert int(busy["used_kv_tokens"]) > 0 and int(busy["max_kv_tokens"]) > 0
    assert int(busy["used_kv_blocks"]) == -(-int(busy["used_kv_tokens"]) // PAGE_SIZE)
    assert 0.0 < float(busy["kv_cache_usage"]) <= 1.0
    assert types <= {observability_pb2.RUNTIME_EVENT_TYPE_BATCH, observability_pb2.RUNTIME_EVENT_TYPE_QUEUE}
    await read_rest(call)


async def test_a_scheduler_holding_its_load_snapshot_lock_does_not_freeze_the_server(served):
    """SGLang reads its load snapshots under the snapshot file's flock, in the calling thread, and a
    scheduler holds that lock while it writes (srt/managers/load_snapshot.py): a scheduler stopped
    there froze the sidecar's event loop, GetLoad, Health and every stream with it. The lock is taken
    here as a writing scheduler takes it (LOCK_EX on the same file)."""
    import fcntl
    import os
    import threading
    import time

    from openengine_adapters.sglang.load_reading import SNAPSHOT_TIMEOUT_S

    fd = os.open(served.tm.load_snapshot_reader.path, os.O_RDONLY)
    # released by a thread at the latest: a frozen event loop (the bug) could not run the finally
    release = threading.Timer(8, fcntl.flock, (fd, fcntl.LOCK_UN))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        release.start()
        started = time.monotonic()
        loads = [served.stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=10) for _ in range(2)]
        health = served.stub.Health(lifecycle_pb2.HealthRequest(), timeout=10)
        *answers, state = await asyncio.gather(*loads, health)
        assert time.monotonic() - started < SNAPSHOT_TIMEOUT_S + 2
        assert state.state == lifecycle_pb2.HEALTH_STATE_READY
        for load in answers:  # the two share one read, which waits on the lock
            assert load.attributes["engine_load"].startswith("unavailable: SGLang's load snapshot"), load
            assert not load.HasField("total_kv_blocks")
    finally:
        release.cancel()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    after = await served.stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=10)
    assert "engine_load" not in after.attributes and after.total_kv_blocks == 8192 // PAGE_SIZE
