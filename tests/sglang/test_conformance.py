"""The conformance suite (``python -m conformance``) against the real SGLang sidecar on the tiny model."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import CPU_FLAGS
from helpers import free_port, run_v0_1_client, v0_1_conformance
from sidecar import drain_output, launch, stop

from conformance import run_suite_async

pytestmark = pytest.mark.asyncio(loop_scope="session")
ADMISSION_LIMIT = 4


async def test_conformance_suite_on_sglang(model_dir):
    kv = {"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "replay_endpoint": f"tcp://*:{free_port()}",
          "topic": "kv"}
    proc, target, lines = await launch(
        "--model-path", str(model_dir), "--served-model-name", "tiny", *CPU_FLAGS,
        "--kv-events-config", json.dumps(kv),
        "--max-in-flight", str(ADMISSION_LIMIT), "--drain-grace-s", "2")
    reader = asyncio.ensure_future(drain_output(proc, lines))
    try:
        # v0.1.0 first: revision 1's destructive run ends with Drain
        v01 = await v0_1_conformance(target, "tiny", destructive=True, expect_admission_limit=ADMISSION_LIMIT,
                                     check_timeout_s=120)
        assert v01.passed >= 40, f"only {v01.passed} v0.1.0 checks passed"
        await run_v0_1_client(target, "--model", "tiny", "--expect-engine", "sglang")
        report = await run_suite_async(target, "tiny", destructive=True, expect_admission_limit=ADMISSION_LIMIT,
                                       check_timeout_s=120)
        print(report.table())
        failures = {r.name: r.reason for r in report.failures()}
        assert not failures, "conformance failures on SGLang:\n" + "\n".join(f"{k}: {v}" for k, v in failures.items())
        assert report.passed >= 45, f"only {report.passed} checks passed"
        # an explicit --kv-events-config replaces the sidecar's private default and is advertised
        assert report.get("kv.event_sources").status == "pass", report.get("kv.event_sources")
    finally:
        assert await stop(proc) == 0, "".join(lines[-40:])
        reader.cancel()
