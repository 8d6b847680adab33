"""Run the OpenEngine gRPC server inside ``vllm serve``, sharing its live engine.

One process then serves both vLLM's OpenAI HTTP API and OpenEngine gRPC on the same engine.
Opt in with both:

    VLLM_PLUGINS=openengine OPENENGINE_GRPC_PORT=50051 vllm serve MODEL ...

vLLM 0.32 hands its engine client only to ``vllm.endpoint_plugins`` (``init_state``), and loads
those only when named in ``VLLM_PLUGINS``; a ``vllm.general_plugins`` entry runs before any engine
exists and cannot reach it. The companion ``vllm.stat_logger_plugins`` entry (``stat_logger.py``) feeds GetLoad and
runtime events from the engine's per-step scheduler stats.

Environment: ``OPENENGINE_GRPC_PORT`` (required to start), ``OPENENGINE_GRPC_HOST`` (default
0.0.0.0), ``OPENENGINE_ADVERTISE_HOST``, ``OPENENGINE_MAX_IN_FLIGHT``, ``OPENENGINE_SURFACES`` (``--surfaces``:
revision-1, v0.1.0 or both, the default), ``OPENENGINE_IGNORED_OPTIONS`` (``--ignored-options``: refuse,
the default, or ignore), ``OPENENGINE_KV_BLOCK_HASH_ENCODING`` (``--kv-block-hash-encoding``: int64, the
default, or decimal_int64), ``OPENENGINE_DRAIN_GRACE_S``
(default 30: on shutdown, how long gRPC requests may finish before they are aborted), and the
security variables (``OPENENGINE_TLS_CERT_FILE`` ..., README "Security"). ``vllm serve --api-key``
(or ``VLLM_API_KEY``) is required on the gRPC port too.
"""

from __future__ import annotations

import contextlib
import logging
import os

from openengine_adapters.types import ROLE_BY_NAME
from openengine_adapters.vllm.stats import SHARED

log = logging.getLogger(__name__)


def _vllm_log() -> logging.Logger:
    """A logger under ``vllm``: vLLM configures only its own loggers, so ours would print nothing."""
    from vllm.logger import init_logger

    return init_logger("vllm.openengine")

PORT_ENV = "OPENENGINE_GRPC_PORT"
HOST_ENV = "OPENENGINE_GRPC_HOST"
MAX_IN_FLIGHT_ENV = "OPENENGINE_MAX_IN_FLIGHT"
DRAIN_GRACE_ENV = "OPENENGINE_DRAIN_GRACE_S"
ROLE_ENV = "OPENENGINE_ROLE"  # aggregated | prefill | decode (default: from the KV connector's kv_role)


def enabled() -> bool:
    return bool(os.environ.get(PORT_ENV))


class OpenEnginePlugin:
    """``vllm.endpoint_plugins`` entry: no HTTP routes; starts the gRPC server on the engine."""

    name = "openengine"
    required_tasks = None

    def __init__(self) -> None:
        self.server = None

    def attach_router(self, app) -> None:
        """No HTTP routes (OpenEngine is gRPC only). The app's lifespan is wrapped so that the
        server's shutdown also stops the gRPC server: drained while the engine still runs, and
        every stream ends with its one terminal event once vLLM has stopped its engine."""
        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(app_):
            async with inner(app_) as state:
                try:
                    yield state
                finally:
                    if self.server is not None:
                        await self.server.stop(self._grace(getattr(app_.state, "engine_client", None)))
                        self.server = None

        app.router.lifespan_context = lifespan

    @staticmethod
    def _grace(engine_client) -> float:
        """The drain grace on shutdown: none once vLLM has stopped its engine (its default
        ``--shutdown-timeout 0`` aborts everything first): nothing is left to finish."""
        if engine_client is not None and (getattr(engine_client, "errored", False)
                                          or not getattr(engine_client, "is_running", True)):
            return 0.0
        return float(os.environ.get(DRAIN_GRACE_ENV, "30"))

    async def init_state(self, engine_client, state, args) -> None:
        if engine_client is None or not enabled():
            if engine_client is not None:
                _vllm_log().warning("the openengine plugin is loaded but %s is not set: no OpenEngine gRPC "
                                    "server (set %s=50051 to serve one on this engine)", PORT_ENV, PORT_ENV)
            return
        import vllm
        from vllm import envs

        from openengine_adapters.server import OpenEngineServer
        from openengine_adapters.server_config import check_plugin_keep_alive, plugin_server_config
        from openengine_adapters.vllm.backend import VllmBackend
        from openengine_adapters.vllm.disagg import default_role

        names = args.served_model_name or [args.model]
        role_name = os.environ.get(ROLE_ENV)
        role = ROLE_BY_NAME[role_name] if role_name else default_role(engine_client.vllm_config.kv_transfer_config)
        backend = await VllmBackend.create(
            engine_client, role=role, served_model_names=names, stats=SHARED,
            version=vllm.__version__, owns_engine=False)
        # vllm serve's own --api-key (else VLLM_API_KEY) guards the gRPC port as it guards HTTP; its LoRA
        # resolver directory is the default allowed root of LoadLora
        config = plugin_server_config(
            PORT_ENV, HOST_ENV, MAX_IN_FLIGHT_ENV,
            engine_api_keys=[k for k in (getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]) if k],
            engine_lora_root=os.environ.get("VLLM_LORA_RESOLVER_CACHE_DIR") or None)
        # vllm serve exits when its engine dies (launcher.watchdog_loop, every 5 s) unless
        # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH; the gRPC server stops with it (attach_router)
        keeps = bool(envs.VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)
        check_plugin_keep_alive(config, keeps, f"vllm serve {'keeps it' if keeps else 'exits'} "
                                f"(VLLM_KEEP_ALIVE_ON_ENGINE_DEATH={int(keeps)}): set that variable instead")
        self.server = await OpenEngineServer(backend, config).start()
        state.openengine_server = self.server
        _vllm_log().info("%s", self.server.ready_line())
