"""What the interop tests share: running a replayed request against a server, waiting on a server's
load, the fixed inputs (a prompt as token ids, trace headers)."""

from __future__ import annotations

import json
import time
import uuid

import grpc

from openengine_adapters.v0_1 import server_pb2

PROMPT = [5 + (i * 7) % 90 for i in range(40)]  # token ids every target's vocabulary holds
TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "dyn=1"}
TIMEOUT = 120.0


def new_id() -> str:
    """Dynamo's request ids are UUIDs (``ctx.id()``)."""
    return str(uuid.uuid4())


def stream(server, request, metadata=(), timeout: float = TIMEOUT):
    """Generate on the v0.1.0 Inference service, as the sidecars call it."""
    return server.inference.Generate(request, metadata=list(metadata), timeout=timeout)


def refusal(call) -> str:
    """Drain ``call``; the status and details if it ended with one, '' if it completed."""
    try:
        for _ in call:
            pass
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return ""


def running(server) -> int:
    load = server.control.GetLoad(server_pb2.GetLoadRequest(), timeout=10)
    return load.running_requests


def wait_idle(server, timeout: float = 60.0) -> float:
    """Until GetLoad reports nothing running (the engine request was not leaked); seconds taken."""
    start = time.monotonic()
    while running(server) != 0:
        assert time.monotonic() - start < timeout, f"{server.target}: still {running(server)} running"
        time.sleep(0.05)
    return time.monotonic() - start


def through_dynamo(handoff: dict) -> dict:
    """Dynamo carries ``disaggregated_params`` between workers as JSON text (serde_json): NaN and
    infinities cannot be written (serde_json refuses them), so they stop here as they would there."""
    return json.loads(json.dumps(handoff, allow_nan=False))
