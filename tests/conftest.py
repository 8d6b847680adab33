"""Shared fixtures: an OpenEngine server on loopback with the fake backend, and a typed stub."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_backend import FakeBackend  # noqa: E402

from openengine_adapters.server import OpenEngineServer, ServerConfig  # noqa: E402
from openengine_adapters.v1 import openengine_pb2_grpc  # noqa: E402


class Harness:
    def __init__(self, server: OpenEngineServer, channel: grpc.aio.Channel, fake: FakeBackend):
        self.server = server
        self.service = server.service
        self.channel = channel
        self.stub = openengine_pb2_grpc.OpenEngineStub(channel)
        self.fake = fake
        self.target = f"127.0.0.1:{server.port}"


@contextlib.asynccontextmanager
async def serve_fake(config: dict | None = None, **fake_kwargs):
    fake = FakeBackend(**fake_kwargs)
    cfg = ServerConfig(host="127.0.0.1", port=0, advertise_host="127.0.0.1",
                       drain_grace_s=1.0, **(config or {}))
    server = await OpenEngineServer(fake, cfg).start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield Harness(server, channel, fake)
    finally:
        await channel.close()
        await server.stop(0.5)


@pytest.fixture
async def oe():
    async with serve_fake() as h:
        yield h


@pytest.fixture
def serve():
    return serve_fake
