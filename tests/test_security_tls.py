"""TLS and mTLS on the server's port, certificate reload (file change, SIGHUP), the plugins' variables,
and the client and conformance CLI options, with certificates made at test time (tests/pki.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from fake_backend import FakeBackend
from helpers import fake_fails_to_start, serve_backend, start_fake, stop_fake
from pki import make_ca

from openengine_adapters.client import OpenEngineClient
from openengine_adapters.security.tls import TlsConfigError, TlsFiles
from openengine_adapters.server import OpenEngineServer
from openengine_adapters.server_config import ServerConfig, plugin_server_config
from openengine_adapters.v1 import engine_pb2, generation_pb2

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# a fresh connection (and so a fresh handshake) per channel: no subchannel shared across channels
FRESH = [("grpc.use_local_subchannel_pool", 1)]
PEM_SIZE = 4096  # every PEM file here is padded to this size, so a rotation can keep the file's stat


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = make_ca(d, "ca"), make_ca(d, "other-ca")
    return SimpleNamespace(
        ca=ca, other=other, server=ca.issue(d, "server", hosts=("localhost", "127.0.0.1")),
        other_server=other.issue(d, "other-server", hosts=("localhost", "127.0.0.1")),
        client=ca.issue(d, "client", client=True), stranger=other.issue(d, "stranger", client=True))


def tls_config(cert, key, client_ca=None, **more) -> dict:
    return {"security": {"tls_cert_file": cert, "tls_key_file": key, "tls_client_ca_file": client_ca, **more}}


async def engine_info(target: str, **client_options) -> engine_pb2.EngineInfo:
    client = OpenEngineClient(target, options=FRESH, **client_options)
    try:
        return await client.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=5)
    finally:
        await client.close()


async def refused(target: str, **client_options) -> grpc.StatusCode:
    try:
        await engine_info(target, **client_options)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    raise AssertionError(f"the server accepted a client with {client_options}")


async def test_tls_port_serves_tls_to_a_trusting_client_and_nothing_else(pki):
    async with serve_backend(FakeBackend(), tls_config(pki.server.cert, pki.server.key)) as h:
        target = f"localhost:{h.server.port}"
        assert (await engine_info(target, tls_ca_file=pki.ca.cert)).engine_name == "fake"
        async with OpenEngineClient(target, tls_ca_file=pki.ca.cert, contract="v0.1.0") as client:
            responses = [r async for r in client.generate(generation_pb2.GenerateRequest(
                prompt="hi", stopping=generation_pb2.StoppingOptions(max_tokens=3)), timeout=10)]
            assert responses[-1].HasField("finished")
        assert await refused(target) == grpc.StatusCode.UNAVAILABLE  # plaintext
        assert await refused(target, tls_ca_file=pki.other.cert) == grpc.StatusCode.UNAVAILABLE  # wrong CA


async def test_mtls_refuses_clients_without_a_certificate_of_its_ca(pki):
    config = tls_config(pki.server.cert, pki.server.key, pki.ca.cert)
    async with serve_backend(FakeBackend(), config) as h:
        target = f"localhost:{h.server.port}"
        info = await engine_info(target, tls_ca_file=pki.ca.cert, tls_cert_file=pki.client.cert,
                                 tls_key_file=pki.client.key)
        assert info.schema_revision == 1
        assert await refused(target, tls_ca_file=pki.ca.cert) == grpc.StatusCode.UNAVAILABLE
        assert await refused(target, tls_ca_file=pki.ca.cert, tls_cert_file=pki.stranger.cert,
                             tls_key_file=pki.stranger.key) == grpc.StatusCode.UNAVAILABLE


def install(src: str, dst: Path) -> None:
    """Write ``src``'s PEM into ``dst`` in place (same inode), padded to PEM_SIZE (text outside the
    PEM block is ignored by every parser)."""
    data = Path(src).read_bytes()
    assert len(data) < PEM_SIZE - 2
    with open(dst, "r+b" if dst.exists() else "wb") as fh:
        fh.write(data + b"\n" + b"#" * (PEM_SIZE - len(data) - 2) + b"\n")


async def test_certificate_files_are_reloaded_when_they_change(pki, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    install(pki.server.cert, cert)
    install(pki.server.key, key)
    async with serve_backend(FakeBackend(), tls_config(str(cert), str(key))) as h:
        target = f"localhost:{h.server.port}"
        await engine_info(target, tls_ca_file=pki.ca.cert)
        # a rotation that stops half-way (new certificate, old key) is refused: the old pair stays served
        install(pki.other_server.cert, cert)
        os.utime(cert, ns=(1, 1))
        await engine_info(target, tls_ca_file=pki.ca.cert)
        install(pki.other_server.key, key)
        os.utime(key, ns=(2, 2))
        assert (await engine_info(target, tls_ca_file=pki.other.cert)).engine_name == "fake"
        assert await refused(target, tls_ca_file=pki.ca.cert) == grpc.StatusCode.UNAVAILABLE
        assert h.server.security.certificates.reloads == 1


async def test_sighup_reloads_certificate_files_whose_stat_did_not_change(pki, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    install(pki.server.cert, cert)
    install(pki.server.key, key)
    os.utime(cert, ns=(5, 5))
    os.utime(key, ns=(5, 5))
    stat = [(os.stat(p).st_ino, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in (cert, key)]
    proc, port, log = await start_fake("--tls-cert-file", str(cert), "--tls-key-file", str(key))
    try:
        assert any("security: transport: TLS" in line for line in log), log
        target = f"localhost:{port}"
        await engine_info(target, tls_ca_file=pki.ca.cert)
        install(pki.other_server.cert, cert)
        install(pki.other_server.key, key)
        os.utime(cert, ns=(5, 5))
        os.utime(key, ns=(5, 5))
        assert [(os.stat(p).st_ino, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in (cert, key)] == stat
        await engine_info(target, tls_ca_file=pki.ca.cert)  # nothing told the server: old pair
        proc.send_signal(signal.SIGHUP)
        for _ in range(50):
            try:
                await engine_info(target, tls_ca_file=pki.other.cert)
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("SIGHUP did not reload the certificate")
        assert await refused(target, tls_ca_file=pki.ca.cert) == grpc.StatusCode.UNAVAILABLE
    finally:
        await stop_fake(proc)
    assert proc.returncode == 0


async def test_half_a_tls_configuration_stops_start_up(pki, tmp_path):
    with pytest.raises(TlsConfigError, match="both --tls-cert-file and --tls-key-file"):
        TlsFiles.from_options(None, None, pki.ca.cert)
    with pytest.raises(TlsConfigError, match="unusable"):  # a key that is not the certificate's
        OpenEngineServer(FakeBackend(), ServerConfig(**tls_config(pki.server.cert, pki.client.key)))
    assert "--tls-key-file" in await fake_fails_to_start("--tls-cert-file", pki.server.cert)


async def test_plugin_variables_configure_tls_and_keys(pki, monkeypatch):
    monkeypatch.setenv("OE_TEST_PORT", "0")
    monkeypatch.setenv("OPENENGINE_TLS_CERT_FILE", pki.server.cert)
    monkeypatch.setenv("OPENENGINE_TLS_KEY_FILE", pki.server.key)
    monkeypatch.setenv("OPENENGINE_TLS_CLIENT_CA_FILE", pki.ca.cert)
    monkeypatch.setenv("OPENENGINE_API_KEY", "env-key")
    config = plugin_server_config("OE_TEST_PORT", "OE_TEST_HOST", "OE_TEST_MAX", engine_api_keys=["engine-key"])
    assert config.security.api_keys == ("engine-key", "env-key")
    config = config.model_copy(update={"host": "127.0.0.1"})
    server = await OpenEngineServer(FakeBackend(), config).start()
    try:
        target = f"localhost:{server.port}"
        mtls = {"tls_ca_file": pki.ca.cert, "tls_cert_file": pki.client.cert, "tls_key_file": pki.client.key}
        for token in ("engine-key", "env-key"):
            assert (await engine_info(target, token=token, **mtls)).engine_name == "fake"
        assert await refused(target, **mtls) == grpc.StatusCode.UNAUTHENTICATED
        assert await refused(target, token="engine-key", tls_ca_file=pki.ca.cert) == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0.1)


async def test_conformance_cli_speaks_mtls_with_a_token(pki):
    proc, port, _ = await start_fake("--tls-cert-file", pki.server.cert, "--tls-key-file", pki.server.key,
                                     "--tls-client-ca-file", pki.ca.cert, "--api-key", "k1")
    try:
        base = [sys.executable, "-m", "conformance", "--target", f"localhost:{port}", "--only", "identity.*", "-q"]
        mtls = ["--tls-ca-file", pki.ca.cert, "--tls-cert-file", pki.client.cert, "--tls-key-file", pki.client.key]
        run = await asyncio.to_thread(subprocess.run, [*base, *mtls, "--token", "k1"], capture_output=True,
                                      text=True, env=ENV, cwd=ROOT, timeout=120)
        assert run.returncode == 0 and " 0 failed" in run.stdout, run.stdout + run.stderr
        run = await asyncio.to_thread(subprocess.run, [*base, *mtls], capture_output=True, text=True,
                                      env={k: v for k, v in ENV.items() if k != "OPENENGINE_API_KEY"},
                                      cwd=ROOT, timeout=120)
        assert run.returncode != 0 and "UNAUTHENTICATED" in run.stdout + run.stderr, run.stdout + run.stderr
    finally:
        await stop_fake(proc)

