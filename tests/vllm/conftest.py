"""Real vLLM engines (CPU) behind the OpenEngine server, one per test module.

Every async test here runs in the session's event loop (each module sets ``pytestmark``),
because an AsyncLLM is bound to the
loop it was created in; engines are module-scoped so that only one lives at a time.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import Harness, serve_backend  # noqa: E402

# Test modules here declare: pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from openengine_adapters.demo_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def reference(model_dir):
    """transformers' view of the same model: tokenizer and float32 log-softmax per position."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()

    class Ref:
        tokenizer = tok

        @staticmethod
        def logprobs(ids):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float()
            return torch.log_softmax(logits, dim=-1)

        @staticmethod
        def greedy(ids, n):
            ids = list(ids)
            for _ in range(n):
                ids.append(int(Ref.logprobs(ids)[-1].argmax()))
            return ids[-n:]

    return Ref


def engine_args(model, **overrides):
    from vllm.engine.arg_utils import AsyncEngineArgs

    kw = dict(model=str(model), enforce_eager=True, gpu_memory_utilization=0.2, max_model_len=512,
              served_model_name=["tiny"], seed=0, dtype="float32")
    kw.update(overrides)
    return AsyncEngineArgs(**kw)


class Served(Harness):
    def __init__(self, server, channel, backend):
        super().__init__(server, channel, backend)
        self.backend = backend
        self.engine = backend.engine


@contextlib.asynccontextmanager
async def serve_vllm(args, **config):
    from openengine_adapters.vllm.startup import start_backend

    backend = await start_backend(args)
    async with serve_backend(backend, config, Served, grace_s=1.0) as served:
        yield served


@pytest.fixture(scope="session")
def mm_model_dir(tmp_path_factory):
    """A tiny random-weight BLIP-2 (image + text) built locally; see ``build_tiny_blip2``."""
    from openengine_adapters.demo_model import build_tiny_blip2

    return build_tiny_blip2(tmp_path_factory.mktemp("models") / "tiny-blip2")
