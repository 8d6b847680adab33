"""A real OTLP/gRPC trace receiver on loopback: the collector's TraceService (``opentelemetry-proto``)
served by the test, keeping every span it is sent, as an OpenTelemetry Collector would receive them."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    status_code: int  # opentelemetry.proto.trace.v1.Status.StatusCode
    attributes: dict = field(default_factory=dict)
    service_name: str = ""


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.port = 0

    async def Export(self, request, context):
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(ReceivedSpan(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                        s.status.code, {a.key: _value(a.value) for a in s.attributes},
                        resource.get("service.name", "")))
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def otlp_receiver():
    """A started receiver on 127.0.0.1 (its ``endpoint`` is what ``--otlp-traces-endpoint`` takes)."""
    receiver = Receiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    receiver.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield receiver
    finally:
        await server.stop(None)
