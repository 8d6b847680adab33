"""The gRPC server around the core: both wire surfaces, health, reflection, signals, CLI options.

Every engine's launcher (``python -m openengine_adapters.<engine>``) builds its backend, then
hands it to ``run`` with the ``ServerConfig`` parsed from the shared flags below.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import errno
import gc
import logging
import os
import signal
import socket
import sys
from typing import Annotated, Literal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from openengine_adapters import engine_processes
from openengine_adapters.backend import EngineBackend
from openengine_adapters.core.service import EngineService, ServiceOptions
from openengine_adapters.metrics import ServerMetrics, metrics_available, serve_metrics
from openengine_adapters.schema import SURFACES
from openengine_adapters.security.config import (
    SecurityConfig,
    add_security_args,
    security_from_args,
    security_from_env,
)
from openengine_adapters.security.serving import ServerSecurity
from openengine_adapters.tracing import endpoint_flag, tracing_from
from openengine_adapters.validation.kv import WILDCARD_HOSTS
from openengine_adapters.validation.leniency import IGNORED_OPTIONS_ENV, IGNORED_OPTIONS_POLICIES, REFUSE
from openengine_adapters.wire import revision1, v0_1
from openengine_adapters.wire.v0_1.translate import BLOCK_HASH_ENCODINGS, INT64, KV_BLOCK_HASH_ENCODING_ENV

log = logging.getLogger(__name__)

ADVERTISE_HOST_ENV = "OPENENGINE_ADVERTISE_HOST"
SURFACES_ENV = "OPENENGINE_SURFACES"  # the plugins' --surfaces
ENGINE_DIED_EXIT_CODE = 3  # a launcher whose engine died while serving (docs/lifecycle.md)
ENGINE_DEATH_STOP_S = 10.0  # at most this long from the death found to the exit (docs/lifecycle.md)


def parse_surfaces(value: str | None) -> tuple[str, ...]:
    """``revision-1,v0.1.0`` (or ``both``, or one of them) -> the surfaces to serve."""
    if not value or value.strip() == "both":
        return SURFACES
    names = tuple(dict.fromkeys(s.strip() for s in value.split(",") if s.strip()))
    unknown = [n for n in names if n not in SURFACES]
    if unknown or not names:
        raise ValueError(f"surfaces: {', '.join(unknown) or value!r} not one of {', '.join(SURFACES)} (or both)")
    return names


class ServerConfig(BaseModel):
    """Options shared by every launcher (flags of the same names)."""

    host: str = "0.0.0.0"
    port: int = Field(50051, ge=0, le=65535)
    advertise_host: str | None = None
    instance_id: str = ""
    max_in_flight: int | None = Field(None, gt=0)
    retry_after_ms: int = Field(100, ge=0)
    finished_id_memory: int = Field(65536, gt=0)
    health_interval_s: float = Field(5.0, gt=0)
    probe_timeout_s: float = Field(30.0, gt=0)
    drain_grace_s: float = Field(30.0, ge=0)
    max_message_mb: int = Field(64, gt=0)
    surfaces: tuple[str, ...] = SURFACES
    # adaptive coalescing (core.coalescing, README "Performance"); a max delay of 0 turns it off
    coalesce_max_delay_ms: float = Field(20.0, ge=0)
    coalesce_message_budget: float = Field(10000.0, gt=0)  # token messages per second before grouping
    max_subscriptions: int | None = Field(64, gt=0)  # open KV + runtime event subscriptions
    # connections (gRPC core's keepalive and idle limits) and the watchdogs (core.watchdog); 0 = off
    keepalive_time_s: float = Field(60.0, ge=0)  # ping an idle connection this often (gRPC's default: 2 h)
    keepalive_timeout_s: float = Field(20.0, gt=0)  # close it when the ping is not answered within this
    keepalive_min_client_interval_s: float = Field(10.0, ge=0)  # clients may ping this often, calls or not
    max_connection_idle_s: float = Field(1800.0, ge=0)  # close a connection with no RPC this long (GOAWAY)
    max_connection_age_s: float = Field(0.0, ge=0)  # off: it would end long streams and subscriptions
    stall_timeout_s: float = Field(30.0, ge=0)  # end a stream whose client takes no message this long
    progress_timeout_s: float = Field(120.0, ge=0)  # work pending, no engine progress this long: hung
    keep_alive_on_engine_death: bool = False  # a dead engine: serve NOT_READY on instead of exiting (run)
    metrics: bool = False  # our Prometheus metrics in the default registry (the engine's /metrics in plugin mode)
    metrics_port: int | None = Field(None, ge=0, le=65535)  # a sidecar serves that registry here
    security: SecurityConfig = SecurityConfig()  # TLS, keys, operator policy, reflection, LoRA root
    # OpenTelemetry spans per RPC over OTLP/gRPC (openengine_adapters.tracing); None: the OTEL_* variables
    otlp_traces_endpoint: str | None = None
    reuse_port: bool = False  # SO_REUSEPORT: off, so a second server on a busy port fails instead of sharing it
    # v0.1.0: a sampling option the engine would not apply is refused, or accepted and dropped (counted)
    ignored_options: Literal["refuse", "ignore"] = REFUSE
    # v0.1.0 SubscribeKvEvents: block hashes as upstream's int64 bytes, or as the decimal Dynamo's KV router reads
    kv_block_hash_encoding: Literal["int64", "decimal_int64"] = INT64


def resolve_advertise_host(bind_host: str, flag: str | None) -> str:
    """Host others should dial: the flag, then $OPENENGINE_ADVERTISE_HOST, then the bind host
    unless it is a wildcard, then this machine's resolved address. Never a wildcard."""
    for candidate in (flag, os.environ.get(ADVERTISE_HOST_ENV)):
        if candidate:
            if candidate in WILDCARD_HOSTS:
                raise ValueError(f"advertise host must be routable, not {candidate!r}")
            return candidate
    if bind_host not in WILDCARD_HOSTS:
        return bind_host
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        address = ""
    return address if address and address not in WILDCARD_HOSTS else "127.0.0.1"


def setting(name: str):
    """The argparse ``type`` of the flag of ``ServerConfig.<name>``: the field's own bounds, checked
    as the command line is parsed, so a bad value ends the launcher at once with the flag and the
    rule, not after the engine has loaded."""
    field = ServerConfig.model_fields[name]
    adapter = TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)

    def convert(text: str):
        try:
            return adapter.validate_python(text)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(f"{exc.errors()[0]['msg'].lower()} (got {text!r})") from None
    return convert


def add_server_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("OpenEngine server")
    d = ServerConfig()

    def numeric(flag: str, help: str) -> None:  # a ServerConfig field's flag: its default and its bounds
        name = flag[2:].replace("-", "_")
        group.add_argument(flag, type=setting(name), default=getattr(d, name), help=help)

    group.add_argument("--host", default=d.host, help="address to bind the gRPC server to")
    numeric("--port", "gRPC port (0 picks a free one)")
    group.add_argument("--reuse-port", action="store_true",
                       help="set SO_REUSEPORT so several servers share the port (off: a busy port is an error, "
                            "found before the engine starts)")
    group.add_argument("--advertise-host", default=None,
                       help=f"host published in discovery responses (else ${ADVERTISE_HOST_ENV}, "
                            "else auto-detected for wildcard binds)")
    group.add_argument("--instance-id", default="", help="stable id reported in EngineInfo/LoadInfo")
    numeric("--max-in-flight", "admission limit; beyond it calls get RESOURCE_EXHAUSTED")
    numeric("--retry-after-ms", "retry hint sent with RESOURCE_EXHAUSTED")
    numeric("--finished-id-memory",
            "finished request ids remembered so Abort answers ALREADY_FINISHED (newest first; also within 8 MiB)")
    numeric("--drain-grace-s", "on SIGTERM, how long running requests may finish before abort")
    numeric("--health-interval-s", "how often grpc.health.v1 is refreshed from the engine")
    numeric("--coalesce-max-delay-ms",
            "adaptive coalescing: above the message budget a stream's token deltas may wait at most this long "
            "to share one message (first tokens and finishes never wait); 0 = off")
    numeric("--coalesce-message-budget",
            "token messages per second, over all streams, that the server sends one per engine step before it "
            "starts grouping")
    numeric("--metrics-port", "serve Prometheus metrics (the engine's and ours) on this HTTP port")
    numeric("--max-subscriptions",
            "open KV and runtime event subscriptions at once; beyond it RESOURCE_EXHAUSTED with the retry hint")
    numeric("--keepalive-time-s", "ping a connection that sent nothing for this long; 0 = gRPC's default (2 h)")
    numeric("--keepalive-timeout-s",
            "close the connection (and end its streams) when a ping is not answered within this")
    numeric("--keepalive-min-client-interval-s",
            "clients may send keepalive pings this often, with or without calls (more often: GOAWAY)")
    numeric("--max-connection-idle-s", "close a connection with no RPC for this long (clients reconnect); 0 = never")
    numeric("--max-connection-age-s",
            "close every connection after this long, streams given --drain-grace-s; 0 = never")
    numeric("--stall-timeout-s",
            "end a Generate or subscription whose client has not taken a message for this long, freeing its "
            "engine request and admission slot; 0 = never")
    numeric("--progress-timeout-s",
            "work pending and no engine progress for this long: Health NOT_READY and every open stream ends "
            "with a retryable error; 0 = never")
    group.add_argument("--keep-alive-on-engine-death", action="store_true",
                       help="when the engine dies, keep serving (Health NOT_READY, new work refused) instead of "
                            f"stopping and exiting with status {ENGINE_DIED_EXIT_CODE} (docs/lifecycle.md)")
    group.add_argument("--surfaces", default="both",
                       help="contract surfaces to serve on the port: revision-1 (openengine.v1.OpenEngine), "
                            "v0.1.0 (openengine.v1.Inference + Control), or both (default)")
    if "--otlp-traces-endpoint" not in parser._option_string_actions:  # vLLM's and SGLang's own: one flag for both
        group.add_argument("--otlp-traces-endpoint", type=endpoint_flag, default=None,
                           help="export an OpenTelemetry span per RPC to this OTLP/gRPC collector (the otel extra; "
                                "else $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), the child of the caller's traceparent")
    group.add_argument("--ignored-options", choices=IGNORED_OPTIONS_POLICIES, default=d.ignored_options,
                       help="v0.1.0 surface: a sampling option this engine accepts but would not apply (ModelInfo "
                            "extra.ignored_options, e.g. a seed on SGLang without deterministic inference) is refused "
                            f"(refuse, the default) or accepted and dropped, counted and logged once (ignore); "
                            f"plugins: ${IGNORED_OPTIONS_ENV}")
    group.add_argument("--kv-block-hash-encoding", choices=BLOCK_HASH_ENCODINGS, default=d.kv_block_hash_encoding,
                       help="v0.1.0 SubscribeKvEvents: block hashes as 8 big-endian bytes (int64, the default, as "
                            "upstream's text lists) or as their decimal text (decimal_int64, the only encoding "
                            f"Dynamo's KV router reads); plugins: ${KV_BLOCK_HASH_ENCODING_ENV}")
    add_security_args(parser)


# the numeric settings a flag and a plugin variable set alike, by ServerConfig field name
NUMERIC_SETTINGS = (
    "max_subscriptions", "drain_grace_s", "retry_after_ms", "keepalive_time_s", "keepalive_timeout_s",
    "keepalive_min_client_interval_s", "max_connection_idle_s", "max_connection_age_s", "stall_timeout_s",
    "progress_timeout_s", "coalesce_max_delay_ms", "coalesce_message_budget", "finished_id_memory")
# the switches a flag and a plugin variable set alike (a variable takes 1/0, true/false, yes/no, on/off)
SWITCH_SETTINGS = ("keep_alive_on_engine_death",)
# the plugins' variables of those flags (``--max-subscriptions`` -> OPENENGINE_MAX_SUBSCRIPTIONS)
PLUGIN_ENV = {name: "OPENENGINE_" + name.upper() for name in NUMERIC_SETTINGS + SWITCH_SETTINGS}


def plugin_server_config(port_env: str, host_env: str, max_in_flight_env: str, *, engine_api_keys=(),
                         engine_admin_api_keys=(), engine_lora_root: str | None = None) -> ServerConfig:
    """The server settings of an in-engine plugin, from its environment (the sidecars' flags as
    variables): host, port, admission limit, ``OPENENGINE_SURFACES`` (the ``--surfaces`` value), the
    numeric flags of ``PLUGIN_ENV`` and the security variables (``security.config.ENV``); the engine
    server's own API keys and LoRA root apply to the gRPC port too."""
    max_in_flight = os.environ.get(max_in_flight_env)
    numbers = {name: os.environ[var] for name, var in PLUGIN_ENV.items() if os.environ.get(var, "").strip()}
    return ServerConfig(host=os.environ.get(host_env, "0.0.0.0"), port=int(os.environ[port_env]),
                        max_in_flight=int(max_in_flight) if max_in_flight else None,
                        surfaces=parse_surfaces(os.environ.get(SURFACES_ENV)), metrics=metrics_available(),
                        security=security_from_env(engine_api_keys, engine_admin_api_keys, engine_lora_root),
                        ignored_options=os.environ.get(IGNORED_OPTIONS_ENV, "").strip() or REFUSE,
                        kv_block_hash_encoding=os.environ.get(KV_BLOCK_HASH_ENCODING_ENV, "").strip() or INT64,
                        **numbers)


def check_plugin_keep_alive(config: ServerConfig, host_keeps_alive: bool, host_rule: str) -> None:
    """In plugin mode the host server decides whether its process outlives a dead engine (the gRPC
    server stops with the host's lifespan): ``OPENENGINE_KEEP_ALIVE_ON_ENGINE_DEATH``, when set, must
    agree with it, or the plugin refuses to start (an option that cannot act is refused, not ignored)."""
    var = PLUGIN_ENV["keep_alive_on_engine_death"]
    if os.environ.get(var, "").strip() and config.keep_alive_on_engine_death != host_keeps_alive:
        raise ValueError(f"{var}={os.environ[var]}: in plugin mode the host server decides whether the process "
                         f"outlives a dead engine, and {host_rule}")


def server_config_from_args(ns: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=ns.host, port=ns.port, advertise_host=ns.advertise_host, instance_id=ns.instance_id,
        max_in_flight=ns.max_in_flight, health_interval_s=ns.health_interval_s,
        surfaces=parse_surfaces(ns.surfaces),
        security=security_from_args(ns), metrics=ns.metrics_port is not None, metrics_port=ns.metrics_port,
        reuse_port=getattr(ns, "reuse_port", False), otlp_traces_endpoint=getattr(ns, "otlp_traces_endpoint", None),
        ignored_options=getattr(ns, "ignored_options", REFUSE),
        kv_block_hash_encoding=getattr(ns, "kv_block_hash_encoding", INT64),
        **{name: getattr(ns, name) for name in NUMERIC_SETTINGS + SWITCH_SETTINGS},
    )


def connection_options(config: ServerConfig) -> list[tuple[str, int]]:
    """gRPC core's keepalive and idle limits, as production gRPC servers set them: a dead peer (no FIN)
    is found within keepalive time + timeout, pings keep going on a connection whose stream is
    blocked (no data to send), and clients may keep their connections alive with pings."""
    ms = lambda s: int(s * 1000)  # noqa: E731
    options = [("grpc.keepalive_timeout_ms", ms(config.keepalive_timeout_s)),
               ("grpc.http2.ping_timeout_ms", ms(config.keepalive_timeout_s)),  # core >= 1.6x times pings by this
               ("grpc.http2.max_pings_without_data", 0),  # core's default stops pinging after 2
               ("grpc.keepalive_permit_without_calls", 1),
               ("grpc.http2.min_recv_ping_interval_without_data_ms", ms(config.keepalive_min_client_interval_s)),
               ("grpc.http2.min_ping_interval_without_data_ms", ms(config.keepalive_min_client_interval_s))]
    if config.keepalive_time_s > 0:
        options.append(("grpc.keepalive_time_ms", ms(config.keepalive_time_s)))
    if config.max_connection_idle_s > 0:
        options.append(("grpc.max_connection_idle_ms", ms(config.max_connection_idle_s)))
    if config.max_connection_age_s > 0:
        options += [("grpc.max_connection_age_ms", ms(config.max_connection_age_s)),
                    ("grpc.max_connection_age_grace_ms", ms(config.drain_grace_s))]
    return options


class PortInUse(OSError):
    """The gRPC port cannot be bound (another server listens there)."""


def _port_message(host: str, port: int, reason: str) -> str:
    return (f"cannot serve gRPC on {host}:{port}: {reason}; stop the other server, choose another --port, "
            "or pass --reuse-port to share the port")


class PortReservation:
    """The gRPC address bound (not listening) before the engine starts: a busy port is found in a
    second, and port 0 is resolved to the port the server will then bind."""

    def __init__(self, host: str, requested_port: int, port: int, sockets: list[socket.socket]) -> None:
        self.host, self.requested_port, self.port, self._sockets = host, requested_port, port, sockets

    def release(self) -> None:
        for s in self._sockets:
            s.close()
        self._sockets = []


def reserve_port(host: str, port: int, reuse_port: bool = False) -> PortReservation:
    """Bind ``host:port`` the way the gRPC server will (SO_REUSEADDR, every resolved address); raise
    ``PortInUse`` when a server already listens there. With ``reuse_port`` sharing is asked for:
    nothing to check. Release it right before the server binds."""
    if reuse_port:
        return PortReservation(host, port, port, [])
    bind_host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(bind_host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortInUse(_port_message(host, port, f"cannot resolve {host!r} ({exc.strerror})")) from None
    sockets: list[socket.socket] = []
    bound = port
    errors: list[OSError] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys((i[0], i[1], i[2], i[3], i[4]) for i in infos):
            s = socket.socket(family, kind, proto)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and bind_host in ("::", ""):
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                s.bind((address[0], bound, *address[2:]))
            except OSError as exc:
                s.close()
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUse(_port_message(host, port, "the address is already in use")) from None
                errors.append(exc)
                continue
            sockets.append(s)
            bound = s.getsockname()[1]  # port 0: every further address gets the same port
        if not sockets:
            reason = errors[0].strerror if errors else "no address to bind"
            raise PortInUse(_port_message(host, port, reason))
    except BaseException:
        for s in sockets:
            s.close()
        raise
    return PortReservation(host, port, bound, sockets)


class OpenEngineServer:
    """A started grpc.aio server serving one backend."""

    def __init__(self, backend: EngineBackend, config: ServerConfig) -> None:
        self.config = config
        self.service = EngineService(backend, ServiceOptions(
            instance_id=config.instance_id,
            max_in_flight=config.max_in_flight,
            retry_after_ms=config.retry_after_ms,
            finished_id_memory=config.finished_id_memory,
            advertise_host=resolve_advertise_host(config.host, config.advertise_host),
            probe_timeout_s=config.probe_timeout_s,
            coalesce_max_delay_ms=config.coalesce_max_delay_ms,
            coalesce_message_budget=config.coalesce_message_budget,
            lora_root=config.security.lora_root,
            max_subscriptions=config.max_subscriptions,
            stall_timeout_s=config.stall_timeout_s,
            progress_timeout_s=config.progress_timeout_s,
            ignored_options=config.ignored_options,
        ))
        limit = config.max_message_mb * 1024 * 1024
        self.security = ServerSecurity(config.security)
        self.metrics = ServerMetrics(self.service) if config.metrics else None
        self.tracing = tracing_from(config.otlp_traces_endpoint)
        interceptors = ([self.tracing.interceptor] if self.tracing else []) + \
            ([self.metrics.interceptor] if self.metrics else []) + [self.security.interceptor]
        self.grpc_server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
            ("grpc.so_reuseport", 1 if config.reuse_port else 0),
            *connection_options(config),
        ])
        self.grpc_health = health.aio.HealthServicer()
        self.service.health.grpc_health = self.grpc_health
        services: tuple[str, ...] = ()
        if "revision-1" in config.surfaces:
            services += (revision1.SERVICE,)
        if "v0.1.0" in config.surfaces:
            services += (v0_1.INFERENCE, v0_1.CONTROL)
        if "revision-1" in config.surfaces:
            revision1.register(self.service, self.grpc_server)
        if "v0.1.0" in config.surfaces:
            v0_1.register(self.service, self.grpc_server, services, config.kv_block_hash_encoding)
        self.services = services
        self.service.health.service_names = services
        health_pb2_grpc.add_HealthServicer_to_server(self.grpc_health, self.grpc_server)
        if config.security.reflection:
            reflection.enable_server_reflection(
                (*services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
                self.grpc_server)
        self.port = 0
        self._monitor: asyncio.Task | None = None

    async def start(self) -> OpenEngineServer:
        """Bind the port first (``PortInUse`` if taken), then start the service and serve. Whoever
        called ``start`` says that it listens (``ready_line``): the launcher's ``run`` or the plugin."""
        try:
            self.port = self.security.bind(self.grpc_server, f"{self.config.host}:{self.config.port}")
        except RuntimeError:  # grpcio raises on a failed bind (older releases returned 0)
            self.port = 0
        if self.port == 0:
            raise PortInUse(_port_message(self.config.host, self.config.port,
                                          "the address is already in use or cannot be bound"))
        self.service.grpc_port = self.port  # where SubscribeKvEvents is, as GetKvEventSources says
        await self.service.start()
        await self.grpc_server.start()
        await self.service.health.refresh()
        self._monitor = asyncio.ensure_future(
            self.service.health.monitor(self.config.health_interval_s))
        for line in self.security.describe():
            log.info("security: %s", line)
        if self.config.metrics_port is not None:
            port = serve_metrics(self.config.metrics_port, self.config.host)
            log.info("Prometheus metrics on http://%s:%d/metrics", self.config.host, port)
        return self

    def ready_line(self) -> str:
        """The one line that says the server listens (tests and tools read the port off its end)."""
        try:
            models = ", ".join(card.names[0] for card in self.service.backend.models())
        except Exception:  # a description only
            models = ""
        what = self.service.identity.engine_name + (f": {models}" if models else "")
        return f"OpenEngine gRPC server ({what}) ready on {self.config.host}:{self.port}"

    async def stop(self, grace_s: float | None = None, force: asyncio.Event | None = None) -> None:
        """Drain (stop accepting, finish or abort after the grace), then stop serving. ``force``
        set during the drain (a second Ctrl-C) aborts what is left at once."""
        grace = self.config.drain_grace_s if grace_s is None else grace_s
        try:
            drain = asyncio.ensure_future(self.service.drain_and_stop(grace))
            forced = asyncio.ensure_future(force.wait()) if force is not None else None
            try:
                await asyncio.wait({drain} | ({forced} if forced else set()), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if forced is not None:
                    forced.cancel()
            if not drain.done():
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await drain
                with contextlib.suppress(asyncio.TimeoutError):  # abort now; never wait long for it
                    await asyncio.wait_for(self.service.drain_and_stop(0), 5.0)
            else:
                drain.result()
        finally:  # whatever the drain did, the server and the engine are stopped
            try:
                await self.grpc_health.enter_graceful_shutdown()
                if self._monitor is not None:
                    self._monitor.cancel()
                await self.grpc_server.stop(1.0)
            finally:
                try:
                    await self.service.backend.shutdown()
                finally:
                    if self.tracing is not None:  # the spans still buffered are exported
                        await asyncio.to_thread(self.tracing.shutdown)

    async def wait(self) -> None:
        await self.grpc_server.wait_for_termination()


def freeze_startup_heap() -> None:
    """Move everything start-up allocated (the engine's and the libraries' objects: millions in a
    vLLM or SGLang front end) out of the garbage collector's reach, as vLLM's own servers do
    (``vllm.utils.gc_utils.freeze_gc_heap``): otherwise each full collection walks them all and
    pauses every stream."""
    gc.collect()
    gc.freeze()


async def run(backend: EngineBackend, config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM, then drain and stop; the same signal again aborts the requests
    still running at once (uvicorn's and ``vllm serve``'s second Ctrl-C). The engine is shut down
    whatever happens, a failed bind included. An engine that dies ends the process (exit status
    ``ENGINE_DIED_EXIT_CODE``, ``exit_on_engine_death``) unless ``keep_alive_on_engine_death``."""
    try:
        server = await OpenEngineServer(backend, config).start()
    except BaseException:
        await backend.shutdown()
        raise
    stop, force = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            log.info("%s: draining for up to %.0f s (send it again to abort the remaining requests now)",
                     sig.name, config.drain_grace_s)
            stop.set()
        elif not force.is_set():
            log.warning("%s again: aborting the remaining requests now", sig.name)
            force.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    loop.add_signal_handler(signal.SIGHUP, server.security.reload)  # re-read the TLS certificate
    freeze_startup_heap()
    print(server.ready_line(), flush=True)
    waits = {asyncio.ensure_future(stop.wait())}
    if not config.keep_alive_on_engine_death:
        waits.add(asyncio.ensure_future(server.service.engine_died.wait()))
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if stop.is_set():
        await server.stop(force=force)
    else:
        await exit_on_engine_death(server)


async def exit_on_engine_death(server: OpenEngineServer) -> None:
    """The engine died (its streams have ended with their retryable error, Health is NOT_READY):
    stop serving, stop what is left of the engine's processes, and end the process with one line
    naming the cause and ``ENGINE_DIED_EXIT_CODE``, within ``ENGINE_DEATH_STOP_S`` (plus 5 s to reap
    the engine's processes), as ``vllm serve`` exits when its engine dies, so that a supervisor
    (Docker, systemd, Kubernetes) starts a new one."""
    service = server.service
    reason = service.watchdog.dead_reason or "the engine died"
    log.error("the engine died (%s): stopping the server", reason)
    try:
        await asyncio.wait_for(server.stop(grace_s=0), ENGINE_DEATH_STOP_S)
    except Exception:  # TimeoutError included: a dead engine's clean-up must not hold the exit
        log.exception("stopping after the engine's death did not finish within %g s", ENGINE_DEATH_STOP_S)
    await asyncio.to_thread(engine_processes.kill_engine_processes)
    # the exit handlers run now (the private KV-event directory, the engine's own), then the process
    # ends without the interpreter's finalization, which after a dead engine prints pages of
    # native-extension notes (Triton's "nanobind: leaked ...") below the one line that says why
    atexit._run_exitfuncs()
    print(f"error: the {service.identity.engine_name} engine died: {reason}; exiting with status "
          f"{ENGINE_DIED_EXIT_CODE} (--keep-alive-on-engine-death keeps serving)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(ENGINE_DIED_EXIT_CODE)
