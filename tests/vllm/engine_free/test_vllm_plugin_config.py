"""The vLLM plugin's start-up decisions that need no engine (the plugin serving inside a real
``vllm serve``: tests/vllm/test_plugin.py, tests/vllm/test_launch.py, tests/vllm/test_chaos.py)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from openengine_adapters.vllm import plugin

pytest.importorskip("vllm.logger")  # runs in the vllm session (the unit session collects this folder too)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_plugin_named_without_its_port_warns_once_and_serves_nothing(monkeypatch):
    """VLLM_PLUGINS=openengine without OPENENGINE_GRPC_PORT: vLLM hands the plugin its engine and the
    plugin says, once, on vLLM's own logger, what to set; no gRPC server starts. (Installed but not named
    in VLLM_PLUGINS, vLLM itself warns that it found the endpoint plugin and skipped it.)"""
    monkeypatch.delenv(plugin.PORT_ENV, raising=False)
    logger = plugin._vllm_log()
    assert logger.name == "vllm.openengine"  # under vLLM's configured "vllm" logger, so it prints
    lines = Lines()
    logger.addHandler(lines)
    try:
        p = plugin.OpenEnginePlugin()
        asyncio.run(p.init_state(SimpleNamespace(), SimpleNamespace(), SimpleNamespace(served_model_name=["tiny"])))
    finally:
        logger.removeHandler(lines)
    assert lines.lines == ["the openengine plugin is loaded but OPENENGINE_GRPC_PORT is not set: no OpenEngine "
                           "gRPC server (set OPENENGINE_GRPC_PORT=50051 to serve one on this engine)"]
    assert p.server is None


def test_plugin_without_an_engine_client_says_nothing(monkeypatch):
    """Handed no engine client, the plugin has nothing to serve and nothing to warn about."""
    monkeypatch.delenv(plugin.PORT_ENV, raising=False)
    logger = plugin._vllm_log()
    lines = Lines()
    logger.addHandler(lines)
    try:
        asyncio.run(plugin.OpenEnginePlugin().init_state(None, SimpleNamespace(), SimpleNamespace()))
    finally:
        logger.removeHandler(lines)
    assert lines.lines == []
