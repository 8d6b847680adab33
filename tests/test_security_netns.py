"""The operator-RPC policy seen from a non-loopback peer: a network namespace joined to this one by a
veth pair, both made and removed by the test (test traffic stays on this machine). The server listens
on the host end (198.18.13.1, RFC 2544's benchmarking range); tests/netns_client.py calls it from
inside the namespace (198.18.13.2)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_backend import FakeBackend

from openengine_adapters.security.channel import open_channel
from openengine_adapters.server import OpenEngineServer
from openengine_adapters.server_config import ServerConfig
from openengine_adapters.v1 import lifecycle_pb2, openengine_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
HOST_IP, NS_IP = "198.18.13.1", "198.18.13.2"
OPERATOR = ("Abort(all)", "Control/Abort(all)", "LoadLora", "Control/UnloadLora", "Control/LoadLora", "UnloadLora",
            "Drain")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def netns():
    name, tag = f"oe-sec-{os.getpid()}", f"{os.getpid() % 100000}"
    host_if, ns_if = f"oeh{tag}", f"oen{tag}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot create a network namespace here (needs root and iproute2): "
                    f"{getattr(exc, 'stderr', '') or exc}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", name)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", name, "addr", "add", f"{NS_IP}/30", "dev", ns_if)
        _ip("-n", name, "link", "set", ns_if, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


async def from_namespace(netns: str, port: int, adapter: str, token: str | None = None) -> dict[str, str]:
    argv = ["ip", "netns", "exec", netns, sys.executable, str(ROOT / "tests" / "netns_client.py"),
            f"{HOST_IP}:{port}", adapter, *([token] if token else [])]
    run = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


async def serve(host: str = HOST_IP, **security) -> OpenEngineServer:
    config = ServerConfig(host=host, port=0, advertise_host=HOST_IP, drain_grace_s=0.5, security=security)
    return await OpenEngineServer(FakeBackend(), config).start()


def adapter(tmp_path: Path) -> str:
    d = tmp_path / "adapters" / "ad"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text('{"r": 8}')
    return str(d)


async def test_operator_rpcs_from_the_network_by_default_refused_loopback_accepted(netns, tmp_path):
    server = await serve(host="0.0.0.0")
    try:
        seen = await from_namespace(netns, server.port, adapter(tmp_path))
        assert seen["GetEngineInfo"] == seen["Generate"] == "OK"
        assert seen["Abort(request_id)"] == "NOT_FOUND"  # a client action: reaches the core
        assert {seen[name] for name in OPERATOR} == {"PERMISSION_DENIED"}, seen
        assert server.service.lifecycle.accepting
        # the same port from loopback: the host's own operator may
        async with open_channel(f"127.0.0.1:{server.port}") as channel:
            reply = await openengine_pb2_grpc.OpenEngineStub(channel).Abort(
                lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests()), timeout=10)
            assert reply.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    finally:
        await server.stop(0.1)


async def test_allow_remote_operator_and_lora_root_open_them(netns, tmp_path):
    server = await serve(allow_remote_operator=True, lora_root=str(tmp_path / "adapters"))
    try:
        seen = await from_namespace(netns, server.port, adapter(tmp_path))
        assert {seen[name] for name in OPERATOR} == {"OK"}, seen
        assert not server.service.lifecycle.accepting  # Drain ran
    finally:
        await server.stop(0.1)


async def test_admin_key_from_the_network_and_lora_needs_a_root(netns, tmp_path):
    server = await serve(admin_api_keys=("admin",))
    try:
        path = adapter(tmp_path)
        anonymous = await from_namespace(netns, server.port, path)
        assert {anonymous[name] for name in OPERATOR} == {"UNAUTHENTICATED"}, anonymous
        seen = await from_namespace(netns, server.port, path, "admin")
        assert seen["Abort(all)"] == seen["Control/Abort(all)"] == seen["Drain"] == "OK", seen
        # no --lora-root: a remote operator may not name directories on this host
        assert seen["LoadLora"] == seen["Control/LoadLora"] == "PERMISSION_DENIED"
        assert seen["UnloadLora"] == seen["Control/UnloadLora"] == "NOT_FOUND"
    finally:
        await server.stop(0.1)
