"""LoRA on a FAITHFUL FAKE of SGLang's tokenizer-manager LoRA API.

Why a fake: SGLang 0.5.23's LoRA layers allocate pinned host memory (``pin_memory=True requires a
CUDA or other accelerator backend``), so ``--enable-lora`` cannot start on this CPU machine. The fake
answers ``load_lora_adapter`` / ``unload_lora_adapter`` with SGLang's own ``LoRAUpdateOutput``
(``success=False`` and a message for a bad path or unknown name) and records the
``GenerateReqInput``s, which are SGLang's real class, so ``lora_path`` is checked as SGLang reads it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import grpc
import pytest
from helpers import collect, expect_status, serve_backend

from openengine_adapters.sglang.backend import SglangBackend, SglangOptions
from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import input_pb2, lora_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")


class FakeLoraTokenizerManager:
    def __init__(self):
        self.context_len = 2048
        self.is_generation = True
        self.tokenizer = None
        self.server_status = None
        self.gracefully_exit = False
        self.adapters: dict[str, str] = {}
        self.received: list = []

    def auto_create_handle_loop(self):
        pass

    async def load_lora_adapter(self, obj, request=None):
        from sglang.srt.managers.io_struct import LoRAUpdateOutput

        try:
            with open(f"{obj.lora_path}/adapter_config.json") as f:
                json.load(f)
        except OSError as exc:
            return LoRAUpdateOutput(success=False, error_message=f"Failed to load LoRA adapter: {exc}")
        self.adapters[obj.lora_name] = obj.lora_path
        return LoRAUpdateOutput(success=True, loaded_adapters=dict(self.adapters))

    async def unload_lora_adapter(self, obj, request=None):
        from sglang.srt.managers.io_struct import LoRAUpdateOutput

        if self.adapters.pop(obj.lora_name, None) is None:
            return LoRAUpdateOutput(success=False, error_message=f"LoRA adapter {obj.lora_name} is not loaded")
        return LoRAUpdateOutput(success=True, loaded_adapters=dict(self.adapters))

    async def generate_request(self, obj, request=None):
        obj.normalize_batch_and_arguments()
        if obj.lora_path is not None and obj.lora_path not in self.adapters:
            raise ValueError(f"LoRA adapter {obj.lora_path} is not loaded")
        self.received.append(obj)
        yield {"text": "x", "output_ids": [9], "meta_info": {
            "id": obj.rid, "prompt_tokens": len(obj.input_ids), "completion_tokens": 1, "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": 1}}}

    def abort_request(self, rid="", abort_all=False):
        pass


def backend(tm):
    sa = SimpleNamespace(disaggregation_mode="null", page_size=1, model_path="/m", served_model_name="tiny",
                         enable_lora=True, chunked_prefill_size=4096, kv_events_config=None, dp_size=1,
                         grammar_backend="none")
    return SglangBackend(tm, sa, {"max_total_num_tokens": 8192}, SglangOptions(served_model_names=("tiny",)))


def gen(rid, lora):
    r = g.GenerateRequest(request_id=rid, model="tiny", token_ids=input_pb2.TokenIds(ids=[1, 2]), lora_name=lora)
    r.stopping.max_tokens = 1
    return r


async def test_lora_lifecycle_and_generation(tmp_path):
    path = tmp_path / "ad"
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    tm = FakeLoraTokenizerManager()
    async with serve_backend(backend(tm)) as h:
        adapter = lora_pb2.LoraAdapter(lora_id=1, lora_name="ad", source_path=str(path))
        resp = await h.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=adapter))
        assert resp.adapter.lora_name == "ad" and not resp.already_loaded
        assert tm.adapters == {"ad": str(path)}
        listed = await h.stub.ListLoras(lora_pb2.ListLorasRequest())
        assert [a.lora_name for a in listed.adapters] == ["ad"]
        responses = await collect(h.stub, gen("with-lora", "ad"))
        assert responses[-1].finished.reason == g.FINISH_REASON_LENGTH
        assert tm.received[-1].lora_path == "ad"  # SGLang resolves the registered name
        await h.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad"))
        assert tm.adapters == {}
        await expect_status(h.stub.Generate(gen("unloaded", "ad")), grpc.StatusCode.NOT_FOUND, "lora_name")


async def test_lora_load_failure_is_invalid_argument(tmp_path):
    tm = FakeLoraTokenizerManager()
    async with serve_backend(backend(tm)) as h:
        adapter = lora_pb2.LoraAdapter(lora_id=1, lora_name="bad", source_path=str(tmp_path))
        await expect_status(h.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=adapter)),
                            grpc.StatusCode.INVALID_ARGUMENT, "adapter")
        assert tm.adapters == {}
