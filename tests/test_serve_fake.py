"""tests/serve_fake.py takes the launchers' flags (``add_server_args``, which the vLLM and SGLang
sidecars declare too), so TLS, keys, the operator policy, reflection, the LoRA root and the limits can
be tried without an engine: checked on the process, through gRPC."""

from __future__ import annotations

import argparse
import subprocess
import sys

import grpc
from grpc_reflection.v1alpha import reflection_pb2_grpc
from helpers import SERVE_FAKE, eventually, gen_request, outcome, refused_stream_requests, start_fake, stop_fake
from pki import make_ca

from openengine_adapters.errors import ERROR_TRAILER
from openengine_adapters.security.channel import open_channel
from openengine_adapters.server_config import add_server_args
from openengine_adapters.v1 import (
    engine_pb2,
    error_pb2,
    generation_pb2,
    lifecycle_pb2,
    lora_pb2,
    observability_pb2,
    openengine_pb2_grpc,
)


def launcher_options() -> set[str]:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_serve_fake_declares_every_launcher_option():
    text = subprocess.run([sys.executable, str(SERVE_FAKE), "--help"], capture_output=True, text=True,
                          check=True).stdout
    options = launcher_options()
    assert {"--tls-cert-file", "--api-key", "--admin-api-key", "--allow-remote-operator", "--no-reflection",
            "--lora-root", "--max-in-flight", "--max-subscriptions"} <= options
    missing = sorted(o for o in options if o not in text)
    assert not missing, f"serve_fake lacks launcher options: {missing}"


async def test_serve_fake_with_tls_keys_no_reflection_a_lora_root_and_limits(tmp_path):
    ca = make_ca(tmp_path / "pki", "ca")
    server = ca.issue(tmp_path / "pki", "server", hosts=("127.0.0.1",))
    root = tmp_path / "loras"
    root.mkdir()
    proc, port, log = await start_fake(
        "--tls-cert-file", server.cert, "--tls-key-file", server.key, "--api-key", "client", "--admin-api-key", "admin",
        "--no-reflection", "--lora-root", str(root), "--max-in-flight", "1", "--max-subscriptions", "1",
        "--instance-id", "fake-7")
    target = f"127.0.0.1:{port}"
    try:
        report = "".join(log)
        for line in ("transport: TLS", "1 API key(s) required", "reflection: off",
                     f"LoRA adapter directories: under {root}"):
            assert line in report, report
        async with grpc.aio.insecure_channel(target) as plain:
            code, _ = await outcome(openengine_pb2_grpc.OpenEngineStub(plain).GetEngineInfo(
                engine_pb2.GetEngineInfoRequest(), timeout=5))
            assert code == grpc.StatusCode.UNAVAILABLE
        async with open_channel(target, ca_file=ca.cert, token="client") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            load = await stub.GetLoad(observability_pb2.GetLoadRequest(), timeout=5)
            assert load.instance_id == "fake-7"
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                refused_stream_requests(), timeout=5)
            assert (await outcome(reflect))[0] == grpc.StatusCode.UNIMPLEMENTED
            # --max-in-flight 1: a second stream is refused while the first runs
            first = stub.Generate(gen_request("hi", metadata={"fake.step_delay_ms": "50"},
                                              stopping=generation_pb2.StoppingOptions(max_tokens=100)))
            assert (await first.read()).HasField("token")
            code, exc = await outcome(stub.Generate(gen_request("hi"), timeout=5))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            first.cancel()
            # --max-subscriptions 1
            sub = stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest())
            seen = []  # the second subscription is refused once the first is registered (no fixed sleep)

            async def second_refused() -> bool:
                seen[:] = await outcome(stub.SubscribeRuntimeEvents(
                    observability_pb2.SubscribeRuntimeEventsRequest(), timeout=1))
                return seen[0] == grpc.StatusCode.RESOURCE_EXHAUSTED

            await eventually(second_refused, timeout=15, message="--max-subscriptions 1 never refused a second")
            code, exc = seen
            sub.cancel()
            # the client key is no operator's
            code, exc = await outcome(stub.Abort(lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests())))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            err = error_pb2.EngineError.FromString(dict(exc.trailing_metadata())[ERROR_TRAILER])
            assert err.details["auth"]
        async with open_channel(target, ca_file=ca.cert, token="admin") as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            outside = lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(lora_id=1, lora_name="a",
                                                                            source_path=str(tmp_path)))
            code, exc = await outcome(stub.LoadLora(outside))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, code
            assert "is not an adapter directory under this server's LoRA root (--lora-root)" in exc.details()
            aborted = await stub.Abort(lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests()))
            assert aborted.status == lifecycle_pb2.ABORT_STATUS_ABORTED
    finally:
        await stop_fake(proc)
    assert proc.returncode == 0
