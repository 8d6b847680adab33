"""--metrics-port: Prometheus text from a sidecar process (the fake engine's), counting what it served."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from helpers import gen_request
from launch_helpers import METRICS, READY

from openengine_adapters.v1 import openengine_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def sidecar():
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "serve_fake.py"), "--host", "127.0.0.1",
                             "--port", "0", "--metrics-port", "0", "--drain-grace-s", "1",
                             "--coalesce-max-delay-ms", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
    ready = READY.search(proc.stdout.readline())
    metrics = None
    for line in proc.stderr:
        if m := METRICS.search(line):
            metrics = m.group(1)
            break
    assert ready and metrics, "sidecar did not start"
    yield f"127.0.0.1:{ready.group(1)}", metrics
    proc.terminate()
    proc.wait(15)


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


async def test_metrics_count_requests_tokens_and_refusals(sidecar):
    target, url = sidecar
    async with grpc.aio.insecure_channel(target) as channel:
        stub = openengine_pb2_grpc.OpenEngineStub(channel)
        for _ in range(2):
            [r async for r in stub.Generate(gen_request("hi", stopping={"max_tokens": 3}))]
        with pytest.raises(grpc.aio.AioRpcError):
            [r async for r in stub.Generate(gen_request("hi", model="nope"))]
    m = scrape(url)
    generate = 'method="/openengine.v1.OpenEngine/Generate"'
    assert m[f'openengine_requests_total{{code="OK",{generate}}}'] == 2
    assert m[f'openengine_requests_total{{code="NOT_FOUND",{generate}}}'] == 1
    assert m["openengine_generated_tokens_total"] == 6
    assert m[f"openengine_in_flight_requests{{{generate}}}"] == 0
    assert m["openengine_admitted_requests"] == 0 and m["openengine_draining"] == 0
    assert "openengine_coalesced_messages_total" in m
    assert 0 <= m["openengine_event_loop_cpu_share"] <= 2  # what the grouping policy read (can exceed 1 briefly)
    assert m["openengine_coalesce_spacing_seconds"] == 0  # three tiny requests: the loop is not busy
    assert any(k.startswith("process_cpu_seconds_total") for k in m), "the process's own metrics are served too"


async def test_grafana_dashboard_reads_only_metrics_the_server_serves(sidecar):
    """deploy/grafana/openengine-dashboard.json: every openengine_* series it queries is served."""
    import json
    import re

    async with grpc.aio.insecure_channel(sidecar[0]) as channel:  # labelled series appear once used
        [r async for r in openengine_pb2_grpc.OpenEngineStub(channel).Generate(gen_request("hi"))]

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "openengine-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {name for e in exprs for name in re.findall(r"\bopenengine_[a-z_]+", e)}
    served = {re.split(r"[{ ]", line)[0] for line in urllib.request.urlopen(sidecar[1], timeout=10).read().decode()
              .splitlines() if line.startswith("openengine_")}
    assert len(queried) >= 8 and queried <= served, f"not served: {queried - served}"
