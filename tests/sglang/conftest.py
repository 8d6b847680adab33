"""The REAL SGLang engine (CPU, tiny random Llama) behind the OpenEngine server.

Runs only in the nox ``sglang`` session: its venv has SGLang 0.5.23 with the CPU torch and the two
test-only import shims of ``tests/sglang/shims`` (on PYTHONPATH there). Every async test runs in the
session's event loop (``pytestmark = pytest.mark.asyncio(loop_scope="session")``): SGLang's
tokenizer manager binds to the loop it first runs on. The aggregated engine is session-scoped
(startup is 15 to 45 s), shared by every module.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest
import pytest_asyncio

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.pop("OPENENGINE_GRPC_PORT", None)  # the plugin stays off in the engines made here
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import Harness, free_port, serve_backend  # noqa: E402

# The CPU recipe of engines/sglang.md ("Running it on these machines").
CPU_ENGINE = dict(device="cpu", attention_backend="torch_native", disable_cuda_graph=True,
                  disable_overlap_schedule=True, sampling_backend="pytorch", grammar_backend="xgrammar",
                  skip_server_warmup=True, max_total_tokens=8192, log_level="warning", random_seed=0)
PAGE_SIZE = 4
# The same recipe as sidecar / `sglang serve` flags.
CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
             "--disable-overlap-schedule", "--sampling-backend", "pytorch", "--grammar-backend", "none",
             "--skip-server-warmup", "--max-total-tokens", "8192", "--page-size", str(PAGE_SIZE))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from openengine_adapters.demo_model import build_tiny_llama  # engine-agnostic builder

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


def engine_kwargs(model, **overrides):
    kw = dict(CPU_ENGINE, model_path=str(model), served_model_name="tiny", page_size=PAGE_SIZE)
    kw.update(overrides)
    return kw


class Served(Harness):
    def __init__(self, server, channel, backend):
        super().__init__(server, channel, backend)
        self.backend = backend
        self.tm = backend.tm


@contextlib.asynccontextmanager
async def serve_sglang(kwargs, options=None, **config):
    from openengine_adapters.sglang.backend import SglangOptions
    from openengine_adapters.sglang.startup import create_engine, start_backend

    engine = create_engine(**kwargs)
    backend = start_backend(engine, options or SglangOptions(served_model_names=("tiny",),
                                                              advertise_host="127.0.0.1"))
    async with serve_backend(backend, config, Served, grace_s=1.0) as served:
        yield served


@pytest.fixture(scope="session")
def kv_ports():
    return free_port(), free_port()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def served(model_dir, kv_ports):
    """One aggregated engine for the session: SGLang's ZMQ KV-event publisher, xgrammar, priority
    scheduling on (the conformance sidecar runs with SGLang's defaults instead)."""
    pub, replay = kv_ports
    kv = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}",
          "topic": "kv", "buffer_steps": 10000}
    kw = engine_kwargs(model_dir, kv_events_config=json.dumps(kv), enable_priority_scheduling=True)
    async with serve_sglang(kw) as s:
        yield s


async def running_requests(tm) -> int:
    loads = await tm.get_loads(include=["core"])
    return sum(x.num_running_reqs + x.num_waiting_reqs for x in loads)
