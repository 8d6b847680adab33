"""``python -m openengine_adapters.trtllm`` as a user runs it (issue 17): a busy port fails before the
engine is touched, SO_REUSEPORT only when asked, a second Ctrl-C aborts the drain, ``--help`` shows
our flags first, ``--version`` names every release, a missing model path is said as such, a server
flag out of its bounds is refused as the command line is read. The
engine is the tests' fake of TensorRT-LLM, installed as ``tensorrt_llm`` for the subprocess."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys

import fake_trtllm
import grpc
import pytest
from launch_helpers import ROOT, Launched, listening, run_quick, stderr_lines, user_env

from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import openengine_pb2_grpc

LAUNCHER = [sys.executable, "-m", "openengine_adapters.trtllm"]
MODEL = "Qwen/Qwen3-0.6B"  # a hub name: the fake builds nothing from it


@pytest.fixture(scope="module")
def fake_env():
    """The launcher's environment with the fake importable as ``tensorrt_llm`` (as the GPU check does)."""
    spec = importlib.util.spec_from_file_location("trtllm_gpu_check_tool", ROOT / "tools" / "trtllm_gpu_check.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    spec.loader.exec_module(tool)
    env = user_env(FAKE_TRTLLM_STEP_S="0.01")
    env["PYTHONPATH"] = os.pathsep.join([tool.fake_engine_dir(), env["PYTHONPATH"]])
    return env


def test_busy_port_fails_at_once_before_the_engine_is_touched():
    """Another server listens on the port: one line naming it and the flags to change, exit 1, in a
    second; tensorrt_llm is not even installed here, so the check ran before the engine."""
    with listening("0.0.0.0") as port:
        code, out, err, seconds = run_quick([*LAUNCHER, MODEL, "--port", str(port)])
    assert code == 1, (out, err)
    assert stderr_lines(err) == [
        f"error: cannot serve gRPC on 0.0.0.0:{port}: the address is already in use; stop the other server, "
        "choose another --port, or pass --reuse-port to share the port"], err
    assert seconds < 10, seconds


async def test_a_second_server_on_a_port_is_refused_unless_both_share_it(fake_env):
    first = Launched([*LAUNCHER, MODEL, "--host", "127.0.0.1", "--port", "0"], fake_env)
    try:
        target = await first.ready(120)
        code, out, err, _ = run_quick([*LAUNCHER, MODEL, "--host", "127.0.0.1", "--port", str(first.port)], fake_env)
        assert code == 1 and "already in use" in err and "--reuse-port" in err, (out, err)
        async with grpc.aio.insecure_channel(target) as channel:  # the first one still serves
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            out = [r async for r in stub.Generate(g.GenerateRequest(prompt="hi", stopping=g.StoppingOptions(
                max_tokens=3)), timeout=30)]
            assert out[-1].HasField("finished")
        first.ctrl_c()
        assert await first.wait(60) == 0
    finally:
        first.kill()
    shared = [Launched([*LAUNCHER, MODEL, "--host", "127.0.0.1", "--port", str(first.port), "--reuse-port"], fake_env)
              for _ in range(2)]
    try:
        for server in shared:  # both listen: SO_REUSEPORT on both, as asked
            await server.ready(120)
    finally:
        for server in shared:
            server.ctrl_c()
        for server in shared:
            await server.wait(60)
            server.kill()


async def test_ctrl_c_drains_and_a_second_ctrl_c_aborts_at_once(fake_env):
    server = Launched([*LAUNCHER, MODEL, "--host", "127.0.0.1", "--port", "0", "--drain-grace-s", "60"],
                      {**fake_env, "FAKE_TRTLLM_STEP_S": "0.05"})  # 250 tokens: 12 s
    try:
        target = await server.ready(120)
        assert "Traceback" not in server.output
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            call = stub.Generate(g.GenerateRequest(prompt="hi", stopping=g.StoppingOptions(max_tokens=250,
                                                                                             ignore_eos=True)))
            await call.read()
            server.ctrl_c()
            await server.wait_for(r"SIGINT: draining for up to 60 s", 30)
            for _ in range(5):  # the drain lets the stream go on
                assert (await asyncio.wait_for(call.read(), 10)).HasField("token")
            server.ctrl_c()
            await server.wait_for(r"SIGINT again: aborting", 30)
            rest = []
            while (r := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
                rest.append(r)
            assert rest[-1].error.code == 11 and rest[-1].error.retryable  # ERROR_CODE_DRAINING
        assert await server.wait(30) == 0
        assert "Traceback" not in server.output, server.output
    finally:
        server.kill()


def test_version_names_ours_the_engine_and_every_schema_release(fake_env):
    from openengine_adapters import schema

    code, out, err, seconds = run_quick([*LAUNCHER, "--version"], fake_env)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("openengine-adapters ") and lines[1].startswith("tensorrt_llm "), out
    assert schema.SCHEMA_RELEASE in out and schema.V0_1_SCHEMA_RELEASE in out, out
    assert lines[1] == f"tensorrt_llm {fake_trtllm.__version__}", out
    code, out, _, _ = run_quick([*LAUNCHER, "--version"])  # no engine installed: said so
    assert code == 0 and out.splitlines()[1] == "tensorrt_llm not installed", out


def test_help_lists_our_flags_first():
    code, out, err, _ = run_quick([*LAUNCHER, "--help"])
    assert code == 0, err
    sections = [line[:-1] for line in out.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert sections[:3] == ["OpenEngine server", "OpenEngine adapter", "OpenEngine security"], sections
    assert out.index("--reuse-port") < out.index("--tp_size") and "--version" in out


def test_missing_model_path_is_said_before_the_engine_starts():
    code, out, err, _ = run_quick([*LAUNCHER, "/no/such/model", "--port", "0"])
    assert code == 1, (out, err)
    assert stderr_lines(err) == ["error: model /no/such/model: no such file or directory (a local model path must "
                                 "exist; a hub model is named ORG/NAME)"], err


@pytest.mark.parametrize("flag, value, rule", [
    ("--coalesce-loop-cpu", "2", "input should be less than or equal to 1"),
    ("--coalesce-max-delay-ms", "-1", "input should be greater than or equal to 0"),
    ("--port", "70000", "input should be less than or equal to 65535"),
    ("--max-in-flight", "1.5", "input should be a valid integer, unable to parse string as an integer"),
    ("--stall-timeout-s", "soon", "input should be a valid number, unable to parse string as a number"),
])
def test_a_server_flag_out_of_its_bounds_is_refused_as_the_command_line_is_read(flag, value, rule):
    """The bounds of the server's settings are checked by the argument parser (exit 2, the flag and
    the rule), not after the engine has loaded (nor, for --port, by a traceback from the early port
    check); tensorrt_llm is not installed here."""
    free = [] if flag == "--port" else ["--port", "0"]  # no clash with a server on the default port
    code, out, err, seconds = run_quick([*LAUNCHER, MODEL, *free, flag, value])
    assert code == 2, (out, err)
    assert stderr_lines(err)[-1] == (f"python -m openengine_adapters.trtllm: error: argument {flag}: {rule} "
                                     f"(got '{value}')"), err
    assert seconds < 10, seconds


@pytest.mark.parametrize("args, code, last", [
    (["--max-in-flight", "0"], 2, "python -m openengine_adapters.trtllm: error: argument --max-in-flight: input "
                                  "should be greater than 0 (got '0')"),
    (["--no-such-flag"], 2, "python -m openengine_adapters.trtllm: error: unrecognized arguments: --no-such-flag"),
    (["/no/such/model"], 1, "error: model /no/such/model: no such file or directory (a local model path must "
                            "exist; a hub model is named ORG/NAME)"),
])
def test_flag_and_model_errors_are_said_before_a_busy_port(args, code, last):
    """With the port busy too, what is wrong with the command line is what the launcher says."""
    model = [] if args[0].startswith("/") else [MODEL]
    with listening("0.0.0.0") as port:
        rc, out, err, _ = run_quick([*LAUNCHER, *model, *args, "--port", str(port)])
    assert rc == code and stderr_lines(err)[-1] == last, (rc, err)


def test_help_shows_defaults_that_mean_something():
    code, out, err, _ = run_quick([*LAUNCHER, "--help"])
    assert code == 0, err
    text = " ".join(out.split())
    assert "(default: True)" not in text and "(default: False)" not in text and "(default: )" not in text
    assert "gRPC port (0 picks a free one) (default: 50051)" in text
    assert "--no-reflection turn server reflection off --lora-root" in text
