"""The conformance suite against the TensorRT-LLM adapter on the fake LLM API."""

from __future__ import annotations

import asyncio
import sys

import fake_trtllm
import grpc
import pytest
from conftest import serve_trtllm
from helpers import expect_status, v0_1_client_argv

from conformance import run_suite_async
from openengine_adapters.types import EngineRole
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import openengine_pb2_grpc


def prefill_args():
    """What the sidecar builds for --role prefill: a cache transceiver, no overlap scheduler."""
    return fake_trtllm.Args(cache_transceiver_config=fake_trtllm.CacheTransceiverConfig("UCX"),
                            disable_overlap_scheduler=True, sampler_type="TRTLLMSampler")


def full_sampler_args():
    """sampler_type TRTLLMSampler: the sampler that honours penalties, min_p and seed, which
    sampling.explicit_params_accepted sends (under the default TorchSampler the adapter refuses
    them, INVALID_ARGUMENT: test_default_sampler_refuses_what_it_ignores)."""
    return fake_trtllm.Args(sampler_type="TRTLLMSampler")


def assert_no_failures(report):
    failures = {r.name: r.reason for r in report.failures()}
    assert not failures, failures


async def run(destructive=False, args=None, only=None, contract="revision-1", **options):
    async with serve_trtllm(args or full_sampler_args(), **options) as h:
        h.llm.step_s = 0.005  # the suite's "long" requests must still be running when it aborts them
        target = f"127.0.0.1:{h.server.port}"
        return await run_suite_async(target, destructive=destructive, only=only, check_timeout_s=20,
                                     contract=contract)


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
    args = prefill_args()
    report = await run(args=args, role=EngineRole.PREFILL)
    assert_no_failures(report)


@pytest.mark.parametrize("role", [EngineRole.AGGREGATED, EngineRole.PREFILL])
async def test_v0_1_contract_on_trtllm_fake(role):
    args = (prefill_args()
            if role == EngineRole.PREFILL else None)
    report = await run(destructive=True, args=args, role=role, contract="v0.1.0")
    print(report.table())
    assert_no_failures(report)
    assert report.get("v0_1.server_info").status == "pass"
    if role == EngineRole.AGGREGATED:
        assert report.passed >= 50 and report.get("v0_1.metadata.repeated_key").status == "pass"


async def test_default_sampler_refuses_what_it_ignores():
    """Under TensorRT-LLM's default sampler the penalties and min_p are refused (INVALID_ARGUMENT
    naming the field), which the suite accepts as the spec's answer to an option the engine would
    ignore, and the seed is refused (its own probe skips the seeded checks): nothing fails."""
    report = await run(args=fake_trtllm.Args())
    assert_no_failures(report)
    assert report.get("sampling.explicit_params_accepted").status == "pass"
    assert report.get("sampling.seeded_deterministic").status == "skip"
    async with serve_trtllm(fake_trtllm.Args()) as h:
        stub = openengine_pb2_grpc.OpenEngineStub(h.channel)
        for knob in ("min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            request = g.GenerateRequest(prompt="hi", sampling={knob: 0.5})
            err = await expect_status(stub.Generate(request), grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{knob}",
                                      "TorchSampler")
            assert err is not None


async def test_an_unmodified_v0_1_client_on_trtllm_fake():
    async with serve_trtllm(None) as h:
        proc = await asyncio.create_subprocess_exec(
            *v0_1_client_argv(f"127.0.0.1:{h.server.port}", "--expect-engine", "tensorrt_llm"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    assert "11 passed, 0 failed" in out.decode()


async def test_guided_checks_fail_when_the_constraint_is_lost(monkeypatch):
    """The guided checks can fail: with the constraint dropped on the way to the engine, every mode
    whose output the suite verifies fails (a structural tag leaves free text free, so it passes)."""
    monkeypatch.setattr(sys.modules["tensorrt_llm.sampling_params"], "GuidedDecodingParams", lambda **kw: None)
    report = await run(only="guided.*")
    assert {r.name for r in report.failures()} == {
        f"guided.{m}" for m in ("json_schema", "regex", "ebnf_grammar", "choice", "json_object")}
