"""tools/trtllm_gpu_check.py, the real-engine check, run here on the fake so it cannot rot."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import sys
from pathlib import Path

import fake_trtllm

from openengine_adapters.validation.catalog import ModelCatalog

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "trtllm_gpu_check.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("trtllm_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def test_gpu_check_runs_on_the_fake():
    """The whole script: sidecar subprocess on the fake, conformance on both contracts, the engine
    checks, one table, exit 0, well inside its 10-minute budget."""
    proc = await asyncio.create_subprocess_exec(sys.executable, str(SCRIPT), "--fake", "--timeout-s", "240",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                cwd=str(ROOT))
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = out.decode()
    assert proc.returncode == 0, text
    for row in ("conformance.v0.1.0", "conformance.revision-1", "sampling.repetition_penalty", "sampling.seed",
                "score.label_tokens", "guided.invalid_grammar", "generate.no_max_tokens"):
        assert any(line.startswith(row) and " pass " in line for line in text.splitlines()), (row, text)
    assert ", 0 fail, " in text.splitlines()[-1]


async def test_gpu_check_fails_an_adapter_that_lets_ignored_knobs_through(serve):
    """The engine checks can fail: with the TorchSampler refusals removed (the adapter before issue
    15; the card's ignored_options since issue 24), the fake accepts the penalties and ignores them,
    and the table says so."""
    tool = load_tool()
    async with serve(fake_trtllm.Args()) as h:
        card = h.server.service.catalog.cards[0]  # the card's ignored_options are what validation refuses
        h.server.service.catalog = ModelCatalog([dataclasses.replace(
            card, generation=dataclasses.replace(card.generation, ignored_options=()))])
        table = tool.Table()
        await tool.engine_checks(h.stub, "fake-model", table)
    rows = {r.name: r for r in table.rows}
    for knob in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        assert rows[f"sampling.{knob}"].status == "fail" and "ignored" in rows[f"sampling.{knob}"].detail
    assert rows["sampling.seed"].status == "fail"
    assert rows["score.label_tokens"].status == "pass"
