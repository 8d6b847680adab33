"""The conformance suite against the TensorRT-LLM adapter on the fake LLM API."""

from __future__ import annotations

import sys

import fake_trtllm
from conftest import serve_trtllm

from conformance import run_suite_async
from openengine_adapters.types import EngineRole


def assert_no_failures(report):
    failures = {r.name: r.reason for r in report.failures()}
    assert not failures, failures


async def run(destructive=False, args=None, only=None, **options):
    async with serve_trtllm(args, **options) as h:
        h.llm.step_s = 0.005  # the suite's "long" requests must still be running when it aborts them
        target = f"127.0.0.1:{h.server.port}"
        return await run_suite_async(target, destructive=destructive, only=only, check_timeout_s=20)


async def test_conformance_on_trtllm_fake():
    report = await run()
    print(report.table())
    assert_no_failures(report)
    assert report.passed >= 69


async def test_destructive_conformance_on_trtllm_fake():
    report = await run(destructive=True)
    assert_no_failures(report)
    assert report.get("lifecycle.drain").status == "pass"


async def test_conformance_on_trtllm_prefill_fake():
    args = fake_trtllm.Args(cache_transceiver_config=fake_trtllm.CacheTransceiverConfig("UCX"))
    report = await run(args=args, role=EngineRole.PREFILL)
    assert_no_failures(report)


async def test_guided_checks_fail_when_the_constraint_is_lost(monkeypatch):
    """The guided checks can fail: with the constraint dropped on the way to the engine, every mode
    whose output the suite verifies fails (a structural tag leaves free text free, so it passes)."""
    monkeypatch.setattr(sys.modules["tensorrt_llm.sampling_params"], "GuidedDecodingParams", lambda **kw: None)
    report = await run(only="guided.*")
    assert {r.name for r in report.failures()} == {
        f"guided.{m}" for m in ("json_schema", "regex", "ebnf_grammar", "choice", "json_object")}
