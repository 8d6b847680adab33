"""OpenTelemetry traces on the fake engine, exported over OTLP/gRPC to a real receiver on loopback
(tests/otlp_receiver.py): a SERVER span per RPC, the child of the caller's W3C traceparent, whose
own context is what the engine is handed; probes untraced; off by default; the flag and the
standard OTEL_* variables; buffered spans exported at stop; a missing extra refused at once."""

from __future__ import annotations

import asyncio
import os
import sys

import grpc
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra")

from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from helpers import SERVE_FAKE, eventually, expect_status, gen_request, start_fake, stop_fake  # noqa: E402
from otlp_receiver import otlp_receiver  # noqa: E402

from openengine_adapters.v0_1 import generation_pb2 as v01_gen  # noqa: E402
from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc  # noqa: E402
from openengine_adapters.v1 import engine_pb2  # noqa: E402

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
SERVER_KIND, STATUS_ERROR = 2, 2  # opentelemetry.proto.trace.v1: SPAN_KIND_SERVER, STATUS_CODE_ERROR
V01_GENERATE = "openengine.v1.Inference/Generate"


def v01_request(**kw) -> v01_gen.GenerateRequest:
    return v01_gen.GenerateRequest(prompt="hi", stopping=v01_gen.StoppingOptions(max_tokens=3), **kw)


@pytest.fixture
def quick_export(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # the batch processor's wait (ms; default 5 s)
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED",
                 "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(name, raising=False)


async def test_rpc_span_continues_the_callers_trace_and_the_engine_gets_its_child(serve, quick_export):
    async with otlp_receiver() as rx, serve({"otlp_traces_endpoint": rx.endpoint}) as oe:
        inference = v01_grpc.InferenceStub(oe.channel)
        [r async for r in inference.Generate(v01_request(request_id="traced-1"), timeout=10,
                                             metadata=(("traceparent", CALLER), ("tracestate", "vendor=x")))]
        handed = oe.fake.seen_params[-1].trace_headers
        version, trace_id, span_id, flags = handed["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", CALLER_TRACE, "01") and span_id != CALLER_SPAN, handed
        assert handed.get("tracestate") == "vendor=x", "the caller's tracestate travels on"
        await eventually(lambda: rx.named(V01_GENERATE), message="no Generate span exported")
        [span] = rx.named(V01_GENERATE)
        assert (span.trace_id, span.parent_span_id, span.span_id) == (CALLER_TRACE, CALLER_SPAN, span_id)
        assert span.kind == SERVER_KIND and span.service_name == "openengine-adapters"
        assert span.attributes["rpc.system"] == "grpc" and span.attributes["rpc.method"] == "Generate"
        assert span.attributes["rpc.grpc.status_code"] == 0
        assert span.attributes["openengine.request_id"] == "traced-1"


async def test_without_a_caller_trace_a_new_one_starts_and_errors_are_marked(serve, quick_export):
    async with otlp_receiver() as rx, serve({"otlp_traces_endpoint": rx.endpoint}) as oe:
        # revision 1 has no trace field: the engine still gets our span's context
        [r async for r in oe.stub.Generate(gen_request("hi", request_id="root-1"), timeout=10)]
        handed = oe.fake.seen_params[-1].trace_headers["traceparent"]
        # a malformed traceparent restarts the trace (W3C), a refused request is an error span
        await expect_status(oe.stub.Generate(gen_request("hi", request_id="refused", model="no-such-model"),
                                             metadata=(("traceparent", "00-zz-00-01"),)),
                            grpc.StatusCode.NOT_FOUND)
        health = health_pb2_grpc.HealthStub(oe.channel)
        await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        name = "openengine.v1.OpenEngine/Generate"
        await eventually(lambda: len(rx.named(name)) == 2, message=f"spans: {rx.spans}")
        ok, refused = sorted(rx.named(name), key=lambda s: s.attributes["openengine.request_id"] != "root-1")
        assert ok.parent_span_id == "" and handed.startswith(f"00-{ok.trace_id}-{ok.span_id}-")
        assert refused.parent_span_id == "" and refused.trace_id != CALLER_TRACE
        assert refused.status_code == STATUS_ERROR and refused.attributes["rpc.grpc.status_code"] == 5
        assert not [s for s in rx.spans if "Health" in s.name], "probes are not traced"


async def test_off_by_default_and_on_from_the_standard_variables(serve, quick_export, monkeypatch):
    async with otlp_receiver() as rx:
        async with serve() as oe:
            assert oe.server.tracing is None
            [r async for r in v01_grpc.InferenceStub(oe.channel).Generate(
                v01_request(), metadata=(("traceparent", CALLER),), timeout=10)]
            assert oe.fake.seen_params[-1].trace_headers == {"traceparent": CALLER}, "off: passed on as is"
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "sidecar-7")
        async with serve() as oe:
            await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=5)
        await eventually(lambda: rx.named("openengine.v1.OpenEngine/GetEngineInfo"))
        assert rx.named("openengine.v1.OpenEngine/GetEngineInfo")[0].service_name == "sidecar-7"
        monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
        async with serve() as oe:
            assert oe.server.tracing is None


async def test_the_flag_exports_and_stop_flushes_the_buffered_spans(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves before the server stops
    async with otlp_receiver() as rx:
        proc, port, _ = await start_fake("--otlp-traces-endpoint", rx.endpoint)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                [r async for r in v01_grpc.InferenceStub(channel).Generate(
                    v01_request(), metadata=(("traceparent", CALLER),), timeout=10)]
            await asyncio.sleep(0.3)
            assert not rx.spans
        finally:
            await stop_fake(proc)
        assert proc.returncode == 0
        [span] = rx.named(V01_GENERATE)
        assert span.parent_span_id == CALLER_SPAN


async def test_the_flag_without_the_extra_ends_the_launcher_at_once():
    # the extra absent: its modules cannot be imported (None in sys.modules)
    code = ("import runpy, sys; sys.modules['opentelemetry.sdk'] = None; "
            f"sys.argv = [{str(SERVE_FAKE)!r}, '--port', '0', '--otlp-traces-endpoint', 'http://127.0.0.1:4317']; "
            f"runpy.run_path({str(SERVE_FAKE)!r}, run_name='__main__')")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT,
                                                env={**os.environ, "PYTHONPATH": str(SERVE_FAKE.parent.parent)})
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, out.decode()
    assert "--otlp-traces-endpoint" in out.decode() and "openengine-adapters[otel]" in out.decode()
