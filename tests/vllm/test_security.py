"""The vLLM sidecar started with TLS, a client key and an admin key (issue 13): one start."""

from __future__ import annotations

import asyncio
import signal

import pytest
from sidecar import drain_output, launch, stop
from sidecar_security import check_secured_sidecar, secure_flags

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_sidecar_with_tls_tokens_and_an_admin_key(model_dir, tmp_path):
    flags, ca_file = secure_flags(tmp_path / "pki")
    proc, target, lines = await launch("--model", str(model_dir), "--served-model-name", "tiny", "--dtype", "float32",
                                       "--max-model-len", "256", "--enforce-eager", "--gpu-memory-utilization", "0.2",
                                       *flags)
    reader = asyncio.ensure_future(drain_output(proc, lines))
    try:
        assert any("security: transport: TLS" in line for line in lines), "".join(lines[-20:])
        await check_secured_sidecar(target, ca_file, "tiny")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await stop(proc)
        await reader
