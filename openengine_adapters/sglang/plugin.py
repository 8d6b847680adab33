"""Run the OpenEngine gRPC server inside ``sglang serve``, sharing its live engine.

Registered under SGLang's ``sglang.srt.plugins`` entry-point group; SGLang calls ``register()`` in
every process it starts (``sglang serve``, ``Engine``, scheduler and detokenizer processes). It
does nothing unless asked:

    OPENENGINE_GRPC_PORT=50051 sglang serve --model-path MODEL ...

Then, in the main process, it wraps the lifespan of SGLang's HTTP app: once SGLang's own startup
ran, it serves OpenEngine gRPC on the same event loop, over the same ``TokenizerManager``; on
shutdown it drains the gRPC server while the engine still runs.

Environment: ``OPENENGINE_GRPC_PORT`` (required to start), ``OPENENGINE_GRPC_HOST`` (default
0.0.0.0), ``OPENENGINE_ADVERTISE_HOST``, ``OPENENGINE_MAX_IN_FLIGHT``, ``OPENENGINE_SURFACES`` (``--surfaces``:
revision-1, v0.1.0 or both, the default), ``OPENENGINE_IGNORED_OPTIONS`` (``--ignored-options``: refuse,
the default, or ignore), ``OPENENGINE_KV_BLOCK_HASH_ENCODING`` (``--kv-block-hash-encoding``: int64, the
default, or decimal_int64), ``OPENENGINE_DRAIN_GRACE_S``
(default 30), and the security variables (``OPENENGINE_TLS_CERT_FILE`` ..., README "Security");
``sglang serve --api-key`` / ``--admin-api-key`` apply to the gRPC port too. ``SGLANG_PLUGINS``
(SGLang's own filter) may name ``openengine``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys

log = logging.getLogger(__name__)

PORT_ENV = "OPENENGINE_GRPC_PORT"
HOST_ENV = "OPENENGINE_GRPC_HOST"
MAX_IN_FLIGHT_ENV = "OPENENGINE_MAX_IN_FLIGHT"
DRAIN_GRACE_ENV = "OPENENGINE_DRAIN_GRACE_S"

_installed = False
_warned = False


def enabled() -> bool:
    return bool(os.environ.get(PORT_ENV))


def _in_sglang_server() -> bool:
    """Whether this process is SGLang's own server (``sglang serve``, ``python -m sglang.launch_server``),
    not an ``Engine`` made elsewhere (our sidecar, a test, a notebook)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (spec is not None and spec.name.startswith("sglang.")) or os.path.basename(sys.argv[0]) == "sglang"


def register() -> None:
    """SGLang's plugin hook: wrap ``sglang serve``'s app lifespan (main process, when enabled)."""
    global _installed, _warned
    if _installed or multiprocessing.current_process().name != "MainProcess":
        return
    if not enabled():
        if not _warned and _in_sglang_server():
            _warned = True
            log.warning("the openengine plugin is installed but %s is not set: no OpenEngine gRPC server "
                        "(set %s=50051 to serve one on this engine)", PORT_ENV, PORT_ENV)
        return
    from sglang.srt.entrypoints import http_server

    install(http_server.app, http_server.get_global_state)
    _installed = True


def install(app, get_global_state) -> None:
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_):
        async with inner(app_) as state:
            server = None
            try:
                server = await start_server(get_global_state(), getattr(app_, "server_args", None))
            except Exception:
                log.exception("OpenEngine gRPC server failed to start; SGLang keeps serving HTTP")
            try:
                yield state
            finally:
                if server is not None:
                    await server.stop(float(os.environ.get(DRAIN_GRACE_ENV, "30")))

    app.router.lifespan_context = lifespan


async def start_server(global_state, server_args=None):
    """An OpenEngineServer over ``sglang serve``'s tokenizer manager (not owning the engine)."""
    from openengine_adapters.server import OpenEngineServer
    from openengine_adapters.server_config import check_plugin_keep_alive, plugin_server_config
    from openengine_adapters.sglang.backend import SglangBackend, SglangOptions
    from openengine_adapters.sglang.startup import sglang_version

    tm = global_state.tokenizer_manager
    server_args = server_args if server_args is not None else tm.server_args
    names = (server_args.served_model_name,) if getattr(server_args, "served_model_name", None) else ()
    backend = SglangBackend(tm, server_args, global_state.scheduler_info,
                            SglangOptions(served_model_names=names,
                                          advertise_host=os.environ.get("OPENENGINE_ADVERTISE_HOST")),
                            version=sglang_version(), owns_engine=False)
    # sglang serve's own --api-key / --admin-api-key guard the gRPC port as they guard HTTP
    config = plugin_server_config(
        PORT_ENV, HOST_ENV, MAX_IN_FLIGHT_ENV,
        engine_api_keys=[k for k in (getattr(server_args, "api_key", None),) if k],
        engine_admin_api_keys=[k for k in (getattr(server_args, "admin_api_key", None),) if k])
    # a dead scheduler or detokenizer makes sglang serve kill its whole process tree (its SIGQUIT handler)
    check_plugin_keep_alive(config, False, "sglang serve ends its process tree when an engine process dies, "
                            "always")
    server = await OpenEngineServer(backend, config).start()
    log.info("%s", server.ready_line())
    return server
