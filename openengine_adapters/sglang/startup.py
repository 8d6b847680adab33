"""Building an SGLang ``Engine`` and its backend (shared by the sidecar and the tests)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from openengine_adapters.sglang.backend import SglangBackend, SglangOptions


def sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return ""


def create_engine(server_args: Any = None, **kwargs: Any):
    """``sglang.srt.entrypoints.engine.Engine`` from a ``ServerArgs`` or its keyword arguments.

    Blocks while SGLang starts its scheduler and detokenizer processes. Call it from the thread
    (and, if any, the running event loop) that will serve requests: the tokenizer manager binds
    to that loop on first use.
    """
    from sglang.srt.entrypoints.engine import Engine

    return Engine(server_args=server_args) if server_args is not None else Engine(**kwargs)


def start_backend(engine, options: SglangOptions = SglangOptions(), *, owns_engine: bool = True) -> SglangBackend:
    """The backend over a started engine (shut down with the backend when ``owns_engine``)."""
    try:
        return SglangBackend.from_engine(engine, options, version=sglang_version(), owns_engine=owns_engine)
    except BaseException:
        if owns_engine:
            engine.shutdown()
        raise
