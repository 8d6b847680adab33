"""The conformance suite (``python -m conformance``) against the real vLLM sidecar on the tiny model (on the
pooling models: tests/vllm/test_pooling.py, on the servers its other tests use)."""

from __future__ import annotations

import asyncio

import pytest
from helpers import run_v0_1_client, v0_1_conformance
from sidecar import drain_output, launch, stop

from conformance import run_suite_async

pytestmark = pytest.mark.asyncio(loop_scope="session")
ADMISSION_LIMIT = 4

# Checks that fail against vLLM because of a known bug in the adapter (name -> reason). Each one is
# asserted to still fail, so a fix shows up as an unexpected pass.
KNOWN_VLLM_BUGS: dict[str, str] = {}


async def test_conformance_suite_on_vllm(model_dir):
    proc, target, lines = await launch(
        "--model", str(model_dir), "--served-model-name", "tiny", "--max-model-len", "512",
        "--gpu-memory-utilization", "0.2", "--enforce-eager", "--dtype", "float32", "--seed", "0",
        "--max-in-flight", str(ADMISSION_LIMIT), "--drain-grace-s", "2")
    reader = asyncio.ensure_future(drain_output(proc, lines))
    try:
        # v0.1.0 first: revision 1's destructive run ends with Drain
        v01 = await v0_1_conformance(target, "tiny", destructive=True, expect_admission_limit=ADMISSION_LIMIT,
                                     check_timeout_s=120)
        assert v01.passed >= 40, f"only {v01.passed} v0.1.0 checks passed"
        await run_v0_1_client(target, "--model", "tiny", "--expect-engine", "vllm")
        report = await run_suite_async(target, "tiny", destructive=True, expect_admission_limit=ADMISSION_LIMIT,
                                       check_timeout_s=120)
        print(report.table())
        failures = {r.name: r.reason for r in report.failures()}
        unexpected = {k: v for k, v in failures.items() if k not in KNOWN_VLLM_BUGS}
        fixed = [k for k in KNOWN_VLLM_BUGS if k not in failures]
        assert not unexpected, "conformance failures on vLLM:\n" + "\n".join(f"{k}: {v}" for k, v in unexpected.items())
        assert not fixed, f"known vLLM bugs no longer fail (update KNOWN_VLLM_BUGS): {fixed}"
        assert report.passed >= 50, f"only {report.passed} checks passed"
    finally:
        await stop(proc)
        reader.cancel()
