"""The server's settings: ``ServerConfig``, the shared flags that fill it in the sidecars
(``add_server_args``, ``server_config_from_args``) and the environment that fills it in the plugins
(``plugin_server_config``), with the gRPC channel options they imply.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from openengine_adapters.metrics import metrics_available
from openengine_adapters.schema import SURFACES
from openengine_adapters.security.config import (
    SecurityConfig,
    add_security_args,
    security_from_args,
    security_from_env,
)
from openengine_adapters.tracing import endpoint_flag
from openengine_adapters.validation.kv import WILDCARD_HOSTS
from openengine_adapters.validation.leniency import IGNORED_OPTIONS_ENV, IGNORED_OPTIONS_POLICIES, REFUSE
from openengine_adapters.wire.v0_1.server_mapping import BLOCK_HASH_ENCODINGS, INT64, KV_BLOCK_HASH_ENCODING_ENV

ADVERTISE_HOST_ENV = "OPENENGINE_ADVERTISE_HOST"

SURFACES_ENV = "OPENENGINE_SURFACES"  # the plugins' --surfaces
ENGINE_DIED_EXIT_CODE = 3  # a launcher whose engine died while serving (docs/lifecycle.md)

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
    coalesce_loop_cpu: float = Field(0.5, ge=0, le=1)  # share of a core the event loop uses before grouping
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
            "adaptive coalescing: while the server's event loop is busy a stream's token deltas may wait at most "
            "this long to share one message (first tokens and finishes never wait); 0 = off")
    numeric("--coalesce-loop-cpu",
            "share of a core the server's event loop uses (or, half of it, while its timer runs late) before "
            "streams start grouping their tokens; 0 = always group")
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
    "progress_timeout_s", "coalesce_max_delay_ms", "coalesce_loop_cpu", "finished_id_memory")


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

