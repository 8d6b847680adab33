"""Shared fixtures: an OpenEngine server on loopback with the fake backend, and a typed stub."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

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
