"""OpenTelemetry traces: one SERVER span per RPC, the child of the caller's W3C ``traceparent``,
whose own context is what the engine is handed as its trace headers, so a trace reads
caller -> our RPC span -> the engine's request span with no hole where the server is.

The ``otel`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-grpc``) is needed
only when tracing is on: ``--otlp-traces-endpoint`` (vLLM's and SGLang's flag of the same name
configures their engine's tracing too) or the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT``; every other ``OTEL_*`` variable (sampler, resource, service name,
batch processor, exporter TLS and headers) is read by the SDK itself. Off, the server installs no
interceptor and the core's one look-up per Generate (``engine_trace_headers``) returns the
caller's headers unchanged: nothing on the token path.

Spans go to a TracerProvider of our own, never the global one, which vLLM and SGLang set for
their own spans in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import logging
import os
from urllib.parse import urlparse

import grpc

from openengine_adapters.core.trace_headers import RPC_TRACE_HEADERS

log = logging.getLogger(__name__)

ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
INSECURE_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")
SERVICE_NAME = "openengine-adapters"
EXTRA_MISSING = ("tracing needs the otel extra: pip install 'openengine-adapters[otel]' "
                 "(opentelemetry-sdk and opentelemetry-exporter-otlp-proto-grpc)")
# probes and discovery of the API: polled every few seconds, never worth a span
UNTRACED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

def available() -> bool:
    """The otel extra is installed."""
    try:
        return all(importlib.util.find_spec(name) is not None
                   for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc"))
    except (ImportError, ValueError):  # a parent package missing, or a module blocked in sys.modules
        return False


def endpoint_flag(text: str) -> str:
    """argparse ``type`` of ``--otlp-traces-endpoint``: a missing extra ends the launcher at once."""
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("an OTLP/gRPC endpoint, e.g. http://otel-collector:4317")
    if not available():
        raise argparse.ArgumentTypeError(EXTRA_MISSING)
    return text


def resolve_endpoint(flag: str | None) -> str | None:
    """The flag, else the standard variables; None (off) when neither is set or OTEL_SDK_DISABLED."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    for candidate in (flag, *(os.environ.get(name) for name in ENDPOINT_ENVS)):
        if candidate and candidate.strip():
            return candidate.strip()
    return None


class Tracing:
    """Our TracerProvider exporting over OTLP/gRPC, and the interceptor making the RPC spans."""

    def __init__(self, endpoint: str, exporter=None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        self.provider = TracerProvider(resource=Resource.create({} if named else {"service.name": SERVICE_NAME}))
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            # as vLLM's exporter: plaintext unless https:// (or the OTEL_*_INSECURE variables say)
            scheme = urlparse(endpoint).scheme if "://" in endpoint else ""
            insecure = None if any(os.environ.get(n) for n in INSECURE_ENVS) else scheme != "https"
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure)
        self.endpoint = endpoint
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("openengine_adapters.server")
        self.propagator = TraceContextTextMapPropagator()
        self.interceptor = TracingInterceptor(self)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (at server stop)."""
        self.provider.shutdown()


def tracing_from(flag: str | None) -> Tracing | None:
    endpoint = resolve_endpoint(flag)
    if endpoint is None:
        return None
    if not available():
        if flag:
            raise RuntimeError(EXTRA_MISSING)
        log.warning("%s; OTLP endpoint %s from the environment is not used", EXTRA_MISSING, endpoint)
        return None
    return Tracing(endpoint)


class _Span:
    """One RPC's span: started as the child of the caller's valid ``traceparent`` (W3C rules of
    ``wire.v0_1.metadata.trace_context``: a malformed or repeated one restarts the trace)."""

    def __init__(self, tracing: Tracing, method: str, metadata, request=None) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        from openengine_adapters.wire.v0_1.metadata import trace_context  # (the core imports this module)

        service, _, name = method.lstrip("/").rpartition("/")
        parent = tracing.propagator.extract(trace_context(metadata or ()))
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        request_id = getattr(request, "request_id", None)
        if request_id:
            attributes["openengine.request_id"] = request_id
        self.span = tracing.tracer.start_span(method.lstrip("/"), context=parent, kind=SpanKind.SERVER,
                                              attributes=attributes)
        headers: dict[str, str] = {}
        tracing.propagator.inject(headers, context=set_span_in_context(self.span))
        self.token = RPC_TRACE_HEADERS.set(headers or None)

    def end(self, code: str, message: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        with contextlib.suppress(ValueError):  # a stream closed from another context: its task ends anyway
            RPC_TRACE_HEADERS.reset(self.token)
        self.span.set_attribute("rpc.grpc.status_code", getattr(grpc.StatusCode, code).value[0])
        if code != "OK":
            self.span.set_status(Status(StatusCode.ERROR, f"{code}: {message}" if message else code))
        self.span.end()


def _code(context) -> tuple[str, str | None]:
    code = context.code()
    details = context.details() if hasattr(context, "details") else None
    return (code.name if isinstance(code, grpc.StatusCode) else "OK"), details or None


class TracingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(UNTRACED_PREFIXES):
            return handler
        tracing, metadata = self.tracing, handler_call_details.invocation_metadata

        def streaming(inner):
            @functools.wraps(inner)
            async def traced(request, context):
                span = _Span(tracing, method, metadata, request)
                code, details = "UNKNOWN", None
                try:
                    async for response in inner(request, context):
                        yield response
                    code, details = _code(context)
                except grpc.aio.AbortError:
                    code, details = _code(context)
                    raise
                except (GeneratorExit, asyncio.CancelledError):
                    code = "CANCELLED"
                    raise
                finally:
                    span.end(code, details)
            return traced

        def unary(inner):
            @functools.wraps(inner)
            async def traced(request, context):
                span = _Span(tracing, method, metadata, request)
                code, details = "UNKNOWN", None
                try:
                    result = await inner(request, context)
                    code, details = _code(context)
                    return result
                except grpc.aio.AbortError:
                    code, details = _code(context)
                    raise
                except asyncio.CancelledError:
                    code = "CANCELLED"
                    raise
                finally:
                    span.end(code, details)
            return traced

        if handler.unary_stream is not None:
            return handler._replace(unary_stream=streaming(handler.unary_stream))
        if handler.stream_stream is not None:  # the request is an iterator: no request id to read
            return handler._replace(stream_stream=streaming(handler.stream_stream))
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=unary(handler.unary_unary))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=unary(handler.stream_unary))
        return handler

