"""The gRPC server around the core: both wire surfaces, health, reflection, signals, the port.

Every engine's launcher (``python -m openengine_adapters.<engine>``) builds its backend, then
hands it to ``run`` with the ``ServerConfig`` (``server_config``) parsed from the shared flags.
"""

from __future__ import annotations

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

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from openengine_adapters import engine_processes
from openengine_adapters.backend import EngineBackend
from openengine_adapters.core.service import EngineService, ServiceOptions
from openengine_adapters.metrics import ServerMetrics, serve_metrics
from openengine_adapters.security.serving import ServerSecurity
from openengine_adapters.server_config import (
    ENGINE_DIED_EXIT_CODE,
    ServerConfig,
    connection_options,
    resolve_advertise_host,
)
from openengine_adapters.tracing import tracing_from
from openengine_adapters.wire import revision1, v0_1

log = logging.getLogger(__name__)


ENGINE_DEATH_STOP_S = 10.0  # at most this long from the death found to the exit (docs/lifecycle.md)

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
            coalesce_loop_cpu=config.coalesce_loop_cpu,
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

