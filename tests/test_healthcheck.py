"""The images' health check (docker/healthcheck.py, Kubernetes' exec probes) against the fake
server: over TLS and mTLS, SERVING only when it trusts the server's CA and, under mTLS, shows a
client certificate; ``--alive`` (liveness) passes a draining server that readiness fails."""

from __future__ import annotations

import asyncio
import os
import sys

from helpers import start_fake, stop_fake
from pki import make_ca

from openengine_adapters.v1 import lifecycle_pb2

HEALTHCHECK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docker", "healthcheck.py")


async def check(port: int, *args: str, **env: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, HEALTHCHECK, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "OPENENGINE_HEALTHCHECK_TARGET": f"127.0.0.1:{port}", **env})
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out.decode()


async def test_healthcheck_speaks_tls_and_mtls(tmp_path):
    ca = make_ca(tmp_path, "ca")
    server = ca.issue(tmp_path, "server", hosts=("openengine.example",))
    client = ca.issue(tmp_path, "client", client=True)
    tls = {"OPENENGINE_TLS_CERT_FILE": server.cert, "OPENENGINE_HEALTHCHECK_SERVER_NAME": "openengine.example"}
    proc, port, _ = await start_fake("--tls-cert-file", server.cert, "--tls-key-file", server.key)
    try:
        assert await check(port, **tls, OPENENGINE_HEALTHCHECK_CA_FILE=ca.cert) == (0, f"127.0.0.1:{port}: SERVING\n")
        code, out = await check(port, **tls)  # the system's roots do not know the test CA
        assert code == 1 and "UNAVAILABLE" in out, out
    finally:
        await stop_fake(proc)
    proc, port, _ = await start_fake("--tls-cert-file", server.cert, "--tls-key-file", server.key,
                                     "--tls-client-ca-file", ca.cert)
    try:
        code, out = await check(port, **tls, OPENENGINE_HEALTHCHECK_CA_FILE=ca.cert)
        assert code == 1, out
        assert await check(port, **tls, OPENENGINE_HEALTHCHECK_CA_FILE=ca.cert,
                           OPENENGINE_HEALTHCHECK_CERT_FILE=client.cert,
                           OPENENGINE_HEALTHCHECK_KEY_FILE=client.key) == (0, f"127.0.0.1:{port}: SERVING\n")
    finally:
        await stop_fake(proc)


async def test_alive_passes_a_server_out_of_rotation(oe):
    port = oe.server.port
    assert await check(port) == (0, f"127.0.0.1:{port}: SERVING\n")
    [r async for r in oe.stub.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True), timeout=10)]
    assert await check(port) == (1, f"127.0.0.1:{port}: NOT_SERVING\n"), "readiness: out of rotation"
    assert await check(port, "--alive") == (0, f"127.0.0.1:{port}: NOT_SERVING\n"), "liveness: still alive"
