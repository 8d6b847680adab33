"""Priority scheduling and LoRA adapters on the REAL vLLM engine (CPU).

vLLM CPU bugs avoided here (engines/vllm.md): base and LoRA requests in one batch, and prompt
logprobs with concurrent requests on a LoRA engine; the LoRA tests run one request at a time.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import pytest_asyncio
from conftest import engine_args, serve_vllm
from helpers import collect, eventually, expect_status
from stream_contract import check_generate_stream

from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, lora_pb2, model_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def priority_engine(model_dir):
    async with serve_vllm(engine_args(model_dir, scheduling_policy="priority", max_num_seqs=1)) as s:
        yield s


async def test_priority_higher_runs_first(priority_engine):
    s = priority_engine
    info = await s.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
    assert info.generation.supports_priority
    finished: list[str] = []

    async def one(rid, priority, max_tokens):
        req = g.GenerateRequest(request_id=rid, prompt="The cat", priority=priority,
                                stopping=g.StoppingOptions(max_tokens=max_tokens, ignore_eos=True))
        check_generate_stream(req, await collect(s.stub, req, timeout=120))
        finished.append(rid)

    blocker = asyncio.ensure_future(one("blocker", 0, 300))
    await eventually(lambda: s.engine.get_num_unfinished_requests() >= 1, timeout=120)
    low = asyncio.ensure_future(one("low", -5, 4))  # max_num_seqs=1: queued behind the blocker
    await eventually(lambda: s.engine.get_num_unfinished_requests() >= 2, timeout=120)
    high = asyncio.ensure_future(one("high", 5, 4))
    await asyncio.gather(blocker, low, high)
    assert finished.index("high") < finished.index("low"), finished


@pytest.fixture(scope="module")
def adapter_dir(model_dir, tmp_path_factory):
    """A LoRA adapter made with peft, with random (non-zero) weights so it changes outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.mul_(8.0)  # make the adapter's effect unmistakable
    path = tmp_path_factory.mktemp("lora") / "adapter"
    peft_model.save_pretrained(path)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def lora_engine(model_dir):
    async with serve_vllm(engine_args(model_dir, enable_lora=True, max_loras=2, max_lora_rank=8,
                                      max_cpu_loras=2)) as s:
        yield s


def peft_greedy(model_dir, adapter, ids, n):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval() if adapter else base.eval()
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


async def test_lora_lifecycle_and_generation_equals_peft(lora_engine, model_dir, adapter_dir, tmp_path):
    s = lora_engine
    ids = [1, 275, 340, 88]
    adapter = lora_pb2.LoraAdapter(lora_id=1, lora_name="ad", source_path=str(adapter_dir))
    resp = await s.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=adapter))
    assert not resp.already_loaded
    again = await s.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=adapter))
    assert again.already_loaded
    listed = await s.stub.ListLoras(lora_pb2.ListLorasRequest())
    assert [a.lora_name for a in listed.adapters] == ["ad"]
    assert 1 in await s.engine.list_loras()

    def req(lora=""):
        return g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=ids), lora_name=lora,
                                 sampling=g.SamplingParams(temperature=0.0),
                                 stopping=g.StoppingOptions(max_tokens=6, ignore_eos=True))

    with_lora = check_generate_stream(req("ad"), await collect(s.stub, req("ad"), timeout=60))
    base = check_generate_stream(req(), await collect(s.stub, req(), timeout=60))
    assert with_lora.token_ids[0] == peft_greedy(model_dir, adapter_dir, ids, 6)
    assert base.token_ids[0] == peft_greedy(model_dir, None, ids, 6)
    assert with_lora.token_ids[0] != base.token_ids[0]

    unloaded = await s.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad"))
    assert unloaded.adapter.lora_id == 1
    assert 1 not in await s.engine.list_loras()
    await expect_status(s.stub.Generate(req("ad")), grpc.StatusCode.NOT_FOUND, "lora_name")


async def test_bad_adapter_is_refused_and_engine_survives(lora_engine, tmp_path):
    s = lora_engine
    bogus = tmp_path / "bogus"
    bogus.mkdir()
    (bogus / "adapter_config.json").write_text("{}")
    await expect_status(s.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
        lora_id=7, lora_name="bogus", source_path=str(bogus)))), grpc.StatusCode.INVALID_ARGUMENT)
    listed = await s.stub.ListLoras(lora_pb2.ListLorasRequest())
    assert "bogus" not in [a.lora_name for a in listed.adapters]
    ok = g.GenerateRequest(prompt="The cat", stopping=g.StoppingOptions(max_tokens=2))
    check_generate_stream(ok, await collect(s.stub, ok, timeout=60))


@pytest.mark.parametrize("contract", ["revision-1", "v0.1.0"])
async def test_lora_conformance_with_a_loadable_adapter(lora_engine, adapter_dir, contract):
    """The conformance suite's LoRA checks with ``--lora-dir`` on the real engine: load, idempotent reload,
    ALREADY_EXISTS for a conflicting id, name or path, list, generate with it, unload, NOT_FOUND after."""
    from conformance import run_suite_async

    report = await run_suite_async(lora_engine.target, only="lora,generate.lora_name", lora_dir=str(adapter_dir),
                                   check_timeout_s=120, contract=contract)
    assert not report.failures(), {r.name: r.reason for r in report.failures()}
    assert report.get("lora.lifecycle").status == "pass", report.get("lora.lifecycle")
