"""Prometheus metrics of the OpenEngine server, beside the engine's own.

They are registered in prometheus_client's default registry, where vLLM's and SGLang's stat
loggers put theirs: in plugin mode they appear on the engine server's own ``/metrics``; a sidecar
serves the same registry with ``--metrics-port``. prometheus_client is what the engines already
depend on; it is imported only when metrics are asked for.

- ``openengine_requests_total{method,code}``: RPCs finished, by full method and gRPC status
  (admission refusals are ``RESOURCE_EXHAUSTED``, drain refusals ``UNAVAILABLE``);
- ``openengine_in_flight_requests{method}``: RPCs in progress (Generate streams, KV and runtime
  event subscribers);
- ``openengine_generated_tokens_total``: tokens streamed to clients;
- ``openengine_admitted_requests``: engine requests holding an admission slot;
- ``openengine_finished_request_ids``: finished ids remembered for Abort (bounded: ``--finished-id-memory``);
- ``openengine_draining``: 1 once the server stops accepting work;
- ``openengine_coalesced_messages_total``: token messages saved by adaptive coalescing;
- ``openengine_event_loop_cpu_share`` / ``openengine_coalesce_spacing_seconds``: what the grouping policy
  read last (the share of a core the server's event loop used) and the spacing it set (0: ungrouped);
- ``openengine_stalled_streams_ended_total``: streams the stall watchdog ended (``core.watchdog``);
- ``openengine_engine_hung``: 1 while the engine is hung or dead;
- ``openengine_priority_ignored_total`` / ``openengine_options_ignored_total{option}``: v0.1.0 requests
  whose ``openengine-priority`` the model does not schedule by / whose option the engine would not
  apply (``--ignored-options ignore``), served anyway (``validation.leniency``).

The interceptor counts per RPC; for Generate it reads each message's token count, one field
access per message.
"""

from __future__ import annotations

import asyncio
import functools

import grpc

# the collectors of the last ServerMetrics in the default registry: a newer server replaces them
_REGISTERED: list = []


class ServerMetrics:
    def __init__(self, service, registry=None) -> None:
        try:
            from prometheus_client import REGISTRY, Counter, Gauge
        except ImportError:
            raise RuntimeError("metrics need prometheus_client (pip install prometheus-client; vLLM and "
                               "SGLang bring it)") from None

        if registry is None:
            registry = REGISTRY
            for collector in _REGISTERED:
                REGISTRY.unregister(collector)
            _REGISTERED.clear()
            registry = _Tracking(REGISTRY)
        self.requests = Counter("openengine_requests", "RPCs finished, by method and gRPC status",
                                ["method", "code"], registry=registry)
        self.in_flight = Gauge("openengine_in_flight_requests", "RPCs in progress, by method", ["method"],
                               registry=registry)
        self.tokens = Counter("openengine_generated_tokens", "Tokens streamed to clients", registry=registry)
        Gauge("openengine_admitted_requests", "Engine requests holding an admission slot",
              registry=registry).set_function(lambda: len(service.registry))
        Gauge("openengine_finished_request_ids", "Finished request ids remembered for Abort (bounded)",
              registry=registry).set_function(lambda: service.registry.finished_count)
        Gauge("openengine_draining", "1 once the server stops accepting work",
              registry=registry).set_function(lambda: 0 if service.lifecycle.accepting else 1)
        Gauge("openengine_engine_hung", "1 while the engine is hung (no progress with work pending) or dead",
              registry=registry).set_function(lambda: int(service.watchdog.hung or bool(service.watchdog.dead_reason)))
        registry.register(_StalledStreams(service.watchdog))
        registry.register(_Ignored(service.leniency))
        if service.coalescer is not None:
            registry.register(_Coalesced(service.coalescer))
        self.interceptor = MetricsInterceptor(self)


class _Tracking:
    """The default registry, remembering what it registered (to replace it for a newer server)."""

    def __init__(self, registry) -> None:
        self._registry = registry

    def register(self, collector) -> None:
        self._registry.register(collector)
        _REGISTERED.append(collector)

    def unregister(self, collector) -> None:
        self._registry.unregister(collector)


class _StalledStreams:
    """``openengine_stalled_streams_ended_total``, read from the watchdog when scraped."""

    def __init__(self, watchdog) -> None:
        self.watchdog = watchdog

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily("openengine_stalled_streams_ended",
                                  "Streams ended because their client took no message for --stall-timeout-s",
                                  value=self.watchdog.stalled_streams)


class _Ignored:
    """What the v0.1.0 reading accepted without applying, read from ``validation.leniency`` when scraped."""

    def __init__(self, leniency) -> None:
        self.leniency = leniency

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily("openengine_priority_ignored",
                                  "Requests whose openengine-priority the model does not schedule by (default order)",
                                  value=self.leniency.priority_ignored)
        options = CounterMetricFamily("openengine_options_ignored",
                                      "Requests whose option the engine would not apply, accepted and dropped "
                                      "(--ignored-options ignore)", labels=["option"])
        for option, count in sorted(self.leniency.options_ignored.items()):
            options.add_metric([option], count)
        yield options


class _Coalesced:
    """``openengine_coalesced_messages_total`` and the policy's last reading, from the coalescer when scraped."""

    def __init__(self, coalescer) -> None:
        self.coalescer = coalescer

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield CounterMetricFamily("openengine_coalesced_messages", "Token messages saved by adaptive coalescing",
                                  value=self.coalescer.messages_saved)
        yield GaugeMetricFamily("openengine_event_loop_cpu_share",
                                "Share of a core the server's event loop used, as adaptive coalescing last read it",
                                value=self.coalescer.cpu_share)
        yield GaugeMetricFamily("openengine_coalesce_spacing_seconds",
                                "How far apart one stream's token messages are now (0: every token at once)",
                                value=self.coalescer.spacing)


def _code(context) -> str:
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "OK"


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        requests, in_flight, tokens = self.metrics.requests, self.metrics.in_flight.labels(method), self.metrics.tokens
        counts_tokens = method.endswith("/Generate")

        if handler.response_streaming and handler.unary_stream is not None:
            inner = handler.unary_stream

            @functools.wraps(inner)
            async def streaming(request, context):
                in_flight.inc()
                code = "OK"
                try:
                    async for response in inner(request, context):
                        if counts_tokens and response.HasField("token"):
                            tokens.inc(len(response.token.tokens))
                        yield response
                    code = _code(context)
                except grpc.aio.AbortError:
                    code = _code(context)
                    raise
                except (asyncio.CancelledError, GeneratorExit):
                    code = "CANCELLED"
                    raise
                except Exception:
                    code = "UNKNOWN"
                    raise
                finally:
                    in_flight.dec()
                    requests.labels(method, code).inc()

            return handler._replace(unary_stream=streaming)
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            @functools.wraps(inner)
            async def unary(request, context):
                in_flight.inc()
                code = "OK"
                try:
                    result = await inner(request, context)
                    code = _code(context)
                    return result
                except grpc.aio.AbortError:
                    code = _code(context)
                    raise
                except asyncio.CancelledError:
                    code = "CANCELLED"
                    raise
                except Exception:
                    code = "UNKNOWN"
                    raise
                finally:
                    in_flight.dec()
                    requests.labels(method, code).inc()

            return handler._replace(unary_unary=unary)
        return handler


def metrics_available() -> bool:
    """prometheus_client is importable (the engines bring it; the fake-engine tests may not)."""
    import importlib.util

    return importlib.util.find_spec("prometheus_client") is not None


class _Merged:
    """Engines whose metrics live in other processes (SGLang with ``--enable-metrics`` sets
    PROMETHEUS_MULTIPROC_DIR): their files, then this process's registry for every family the files
    do not already hold (ours included), so no series is served twice."""

    def __init__(self, directory: str) -> None:
        from prometheus_client import CollectorRegistry, multiprocess

        self.files = CollectorRegistry()
        multiprocess.MultiProcessCollector(self.files, path=directory)

    def collect(self):
        from prometheus_client import REGISTRY

        seen = set()
        for family in self.files.collect():
            seen.add(family.name)
            yield family
        for family in REGISTRY.collect():
            if family.name not in seen:
                yield family


def serve_metrics(port: int, host: str = "0.0.0.0") -> int:
    """Serve the engine's metrics and ours over HTTP; return the port."""
    import os

    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    registry = REGISTRY
    if directory := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        registry.register(_Merged(directory))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server.server_port
