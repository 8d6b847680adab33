"""The TensorRT-LLM adapter on a real engine: what only a GPU can confirm, in one table.

On a machine with a GPU and TensorRT-LLM 1.2 installed::

    python tools/trtllm_gpu_check.py                      # Qwen/Qwen3-0.6B, ~3-6 minutes
    python tools/trtllm_gpu_check.py --model PATH --json report.json

It starts the sidecar (``python -m openengine_adapters.trtllm``) on a small model with xgrammar
guided decoding, waits for it to serve, runs the conformance suite on both contracts (v0.1.0,
then revision 1), then the checks that the tests' fake of TensorRT-LLM can only assume (issue 15):

- ``sampling.*``: the knobs TensorRT-LLM's PyTorch sampler may ignore (repetition / presence /
  frequency penalties, min_p, per-request seed). Each is either refused before acceptance
  (INVALID_ARGUMENT naming it) or must change the output as it should; accepted and ignored fails.
- ``score.label_tokens``: the label score from generation logits equals the output logprob the
  engine reports for the same token after the same prompt.
- ``guided.invalid_grammar``: an unparsable regex ends in one clean error (a status before
  acceptance or one terminal EngineError), and the engine serves the next request.
- ``generate.*``: no ``max_tokens`` (the engine deduces it), n > 1 without knobs, a multi-token
  stop string, a seed, a finish reason on every output.

It stops the sidecar at the end and exits non-zero on any failure. CI runs it with ``--fake``
(the tests' fake of the LLM API installed as ``tensorrt_llm`` in a temporary directory), so the
script cannot rot; on the fake the sampling checks only see what the fake models.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance import run_suite_async  # noqa: E402
from openengine_adapters.v1 import (  # noqa: E402
    engine_pb2,
    input_pb2,
    lifecycle_pb2,
    openengine_pb2_grpc,
    scoring_pb2,
    tasks_pb2,
)
from openengine_adapters.v1 import (  # noqa: E402
    generation_pb2 as g,
)

FAKE_SUBMODULES = ("sampling_params", "disaggregated_params", "scheduling_params", "llmapi", "lora_helper",
                   "executor/request", "executor/utils")
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@dataclass
class Row:
    name: str
    status: str  # pass / fail / skip
    detail: str = ""


@dataclass
class Table:
    rows: list[Row] = field(default_factory=list)

    def add(self, name: str, ok: bool | None, detail: str = "") -> None:
        self.rows.append(Row(name, "skip" if ok is None else "pass" if ok else "fail", detail))

    def render(self) -> str:
        width = max(len(r.name) for r in self.rows) if self.rows else 10
        lines = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  ------"]
        lines += [f"{r.name:<{width}}  {r.status:<6}  {r.detail}" for r in self.rows]
        counts = {s: sum(r.status == s for r in self.rows) for s in ("pass", "fail", "skip")}
        lines.append(f"gpu check: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip")
        return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_engine_dir() -> str:
    """A directory holding ``tensorrt_llm``: the tests' fake of its LLM API (CI has no GPU)."""
    root = Path(tempfile.mkdtemp(prefix="trtllm-fake-"))
    pkg = root / "tensorrt_llm"
    (pkg / "executor").mkdir(parents=True)
    for src in (ROOT / "tests" / "trtllm" / "fake_trtllm").glob("*.py"):
        (pkg / src.name).write_text(src.read_text())
    (pkg / "executor" / "__init__.py").write_text("")
    for name in FAKE_SUBMODULES:
        (pkg / f"{name}.py").write_text("from tensorrt_llm import *  # noqa: F403\n")
    return str(root)


def sidecar_argv(ns: argparse.Namespace, port: int, extra_yaml: str) -> list[str]:
    return [sys.executable, "-m", "openengine_adapters.trtllm", ns.model, "--host", "127.0.0.1",
            "--extra_llm_api_options", extra_yaml,
            "--port", str(port), "--guided_decoding_backend", "xgrammar", "--max_seq_len", str(ns.max_seq_len),
            "--kv_cache_free_gpu_memory_fraction", str(ns.kv_fraction), "--max_batch_size", "16",
            *ns.sidecar_arg]


async def wait_serving(stub, proc: subprocess.Popen, deadline: float) -> None:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the sidecar exited with {proc.returncode} before serving")
        try:
            health = await stub.Health(lifecycle_pb2.HealthRequest(), timeout=5)
            if health.state == lifecycle_pb2.HEALTH_STATE_READY:
                return
        except grpc.aio.AioRpcError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the sidecar did not become READY in time")
        await asyncio.sleep(1.0)


@dataclass
class Outcome:
    """One Generate: token ids, text and logprobs per output, finish events per output, prompt
    token ids (when prompt logprobs were asked for) and error events."""

    ids: dict[int, list[int]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)
    logprobs: dict[int, list[float | None]] = field(default_factory=dict)
    finished: dict = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    errors: list = field(default_factory=list)


async def generate(stub, timeout: float = 60.0, **kw) -> Outcome:
    o = Outcome()
    async for r in stub.Generate(g.GenerateRequest(**kw), timeout=timeout):
        kind = r.WhichOneof("event")
        if kind == "prompt":
            o.prompt_ids = [t.token_id for t in r.prompt.tokens]
        elif kind == "token":
            i = r.token.output_index
            o.ids.setdefault(i, []).extend(t.token_id for t in r.token.tokens)
            o.logprobs.setdefault(i, []).extend(t.logprob if t.HasField("logprob") else None
                                                for t in r.token.tokens)
            o.text[i] = o.text.get(i, "") + r.token.text
        elif kind == "finished":
            o.finished[r.finished.output_index] = r.finished
        elif kind == "error":
            o.errors.append(r.error)
    return o


def stopping(n: int) -> g.StoppingOptions:
    return g.StoppingOptions(max_tokens=n, ignore_eos=True)


async def refused_or(stub, name: str, table: Table, check):
    """Run ``check`` (which generates with the knob set); a refusal naming the knob also passes."""
    try:
        ok, detail = await check()
    except grpc.aio.AioRpcError as exc:
        field_name = name.split(".")[-1]
        refused = exc.code() == grpc.StatusCode.INVALID_ARGUMENT and field_name in (exc.details() or "")
        table.add(name, refused, f"refused: {exc.code().name} {exc.details()}" if refused
                  else f"{exc.code().name}: {exc.details()}")
        return
    table.add(name, ok, detail)


async def engine_checks(stub, model: str, table: Table) -> None:
    base = {"prompt": PROMPT, "model": model}
    greedy = g.SamplingParams(temperature=0.0)
    plain = (await generate(stub, sampling=greedy, stopping=stopping(24), **base)).ids.get(0, [])

    for knob, params in (("repetition_penalty", {"repetition_penalty": 2.0}),
                         ("presence_penalty", {"presence_penalty": 2.0}),
                         ("frequency_penalty", {"frequency_penalty": 2.0})):
        async def penalty(params=params):
            got = (await generate(stub, sampling=g.SamplingParams(temperature=0.0, **params),
                                  stopping=stopping(24), **base)).ids.get(0, [])
            return got != plain, ("greedy output changed" if got != plain
                                  else "accepted, but the greedy output is the same as without it (ignored?)")
        await refused_or(stub, f"sampling.{knob}", table, penalty)

    async def min_p():
        got = (await generate(stub, sampling=g.SamplingParams(temperature=1.0, min_p=1.0),
                              stopping=stopping(24), **base)).ids.get(0, [])
        return got == plain, ("min_p 1.0 at temperature 1 equals greedy" if got == plain
                              else "min_p 1.0 at temperature 1 differs from greedy (ignored?)")
    await refused_or(stub, "sampling.min_p", table, min_p)

    async def seed():
        runs = [(await generate(stub, sampling=g.SamplingParams(temperature=1.5, seed=s),
                                stopping=stopping(24), **base)).ids.get(0, []) for s in (7, 7, 8, 9)]
        same, differs = runs[0] == runs[1], runs[0] != runs[2] or runs[0] != runs[3]
        return same and differs, f"same seed same tokens: {same}; other seeds differ: {differs}"
    await refused_or(stub, "sampling.seed", table, seed)

    # no max_tokens: the engine deduces it (bounded by max_seq_len); the stream still finishes
    try:
        o = await generate(stub, prompt="Count: 1, 2, 3,", model=model, sampling=greedy, timeout=180)
        table.add("generate.no_max_tokens", bool(o.finished) and not o.errors,
                  f"{len(o.ids.get(0, []))} tokens, finish {[f.reason for f in o.finished.values()]}")
    except grpc.aio.AioRpcError as exc:
        table.add("generate.no_max_tokens", False, f"{exc.code().name}: {exc.details()}")

    # n > 1 with no sampling knob: accepted, a finish reason on every output
    try:
        o = await generate(stub, sampling=g.SamplingParams(num_sequences=3),
                           stopping=g.StoppingOptions(max_tokens=8), **base)
        table.add("generate.n3_without_knobs", sorted(o.finished) == [0, 1, 2] and not o.errors,
                  f"outputs finished: {sorted(o.finished)}")
    except grpc.aio.AioRpcError as exc:
        table.add("generate.n3_without_knobs", False, f"{exc.code().name}: {exc.details()}")

    # a multi-token stop string: cut from the text, reported as the stop match
    words = (await generate(stub, sampling=greedy, stopping=stopping(24), **base)).text.get(0, "").split()
    if len(words) >= 3:
        stop = " " + words[2]
        o = await generate(stub, sampling=greedy, stopping=g.StoppingOptions(
            max_tokens=24, conditions=[g.StopCondition(stop_text=stop)]), **base)
        fin, text = o.finished.get(0), o.text.get(0, "")
        table.add("generate.stop_text", fin is not None and fin.stop_match.stop_text == stop and stop not in text,
                  f"stop {stop!r}: text {text!r}")
    else:
        table.add("generate.stop_text", None, "greedy output has fewer than three words")

    # label scores from generation logits == the engine's own logprob of the greedy next token
    try:
        prompt_ids = (await generate(stub, sampling=greedy, stopping=stopping(1), response=g.ResponseOptions(
            return_prompt_logprobs=True), **base)).prompt_ids
        first = await generate(stub, token_ids=input_pb2.TokenIds(ids=prompt_ids), model=model, sampling=greedy,
                               stopping=stopping(1), response=g.ResponseOptions(return_output_logprobs=True))
        label, lp = first.ids[0][0], first.logprobs[0][0]
        resp = await stub.Score(scoring_pb2.ScoreRequest(
            context=tasks_pb2.TaskRequestContext(request_id="gpu-score", model=model),
            groups=[scoring_pb2.ScoreGroup(
                group_id="g", query=tasks_pb2.TaskInput(item_id="q", token_ids=input_pb2.TokenIds(ids=prompt_ids[:-1])),
                candidates=[tasks_pb2.TaskInput(item_id="c", token_ids=input_pb2.TokenIds(ids=prompt_ids[-1:]))])],
            options=scoring_pb2.ScoreOptions(label_token_ids=[label])), timeout=60)
        score = resp.groups[0].candidates[0].scores.values[0]
        table.add("score.label_tokens", lp is not None and math.isclose(score, lp, abs_tol=0.05),
                  f"score {score:.4f} vs the engine's output logprob {lp}")
    except (grpc.aio.AioRpcError, KeyError, IndexError) as exc:
        table.add("score.label_tokens", False, f"{type(exc).__name__}: {exc}")

    # an unparsable grammar: one clean error, and the engine keeps serving
    try:
        o = await generate(stub, guided=g.GuidedDecoding(regex="(unclosed"),
                           stopping=g.StoppingOptions(max_tokens=8), **base)
        ok = len(o.errors) == 1 and not o.finished
        detail = (f"terminal EngineError {o.errors[0].code}: {o.errors[0].message[:80]}" if o.errors
                  else "no error: the grammar was accepted")
    except grpc.aio.AioRpcError as exc:
        ok, detail = exc.code() == grpc.StatusCode.INVALID_ARGUMENT, f"status {exc.code().name}: {exc.details()[:80]}"
    served = bool((await generate(stub, sampling=greedy, stopping=stopping(2), **base)).finished)
    table.add("guided.invalid_grammar", ok and served, f"{detail}; next request served: {served}")


async def run(ns: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + ns.timeout_s
    port = free_port()
    env = dict(os.environ)
    if ns.fake:
        env["PYTHONPATH"] = os.pathsep.join([fake_engine_dir(), str(ROOT), env.get("PYTHONPATH", "")])
        env.setdefault("FAKE_TRTLLM_STEP_S", "0.005")
    extra_yaml = Path(tempfile.mkdtemp(prefix="trtllm-gpu-check-")) / "extra.yaml"
    extra_yaml.write_text(f"sampler_type: {ns.sampler}\n")
    log = open(ns.log, "w") if ns.log else subprocess.DEVNULL
    proc = subprocess.Popen(sidecar_argv(ns, port, str(extra_yaml)), env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=str(ROOT))
    table = Table()
    target = f"127.0.0.1:{port}"
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = openengine_pb2_grpc.OpenEngineStub(channel)
            await wait_serving(stub, proc, deadline)
            table.add("sidecar.ready", True, f"after {time.monotonic() - started:.0f} s")
            engine = await stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=30)
            model = engine.supported_models[0]
            table.add("sidecar.engine", engine.engine_name == "tensorrt_llm",
                      f"{engine.engine_name} {engine.engine_version}, model {model}")
            for contract in ("v0.1.0", "revision-1"):
                budget = max(30.0, min(120.0, deadline - time.monotonic() - 120))
                report = await asyncio.wait_for(run_suite_async(target, model, contract=contract,
                                                                check_timeout_s=60), budget)
                # under TorchSampler the adapter refuses the knobs it ignores: that check then fails
                expected = {"sampling.explicit_params_accepted"} if ns.sampler != "TRTLLMSampler" else set()
                fails = [f"{r.name}: {r.reason}" for r in report.failures() if r.name not in expected]
                table.add(f"conformance.{contract}", not fails,
                          f"{report.passed} passed, {report.skipped} skipped" + ("; " + " | ".join(fails)[:400]
                                                                                 if fails else ""))
            await asyncio.wait_for(engine_checks(stub, model, table), max(30.0, deadline - time.monotonic()))
    except Exception as exc:  # a broken run is a failed run, reported in the table
        table.add("run", False, f"{type(exc).__name__}: {exc}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not subprocess.DEVNULL:
            log.close()
    table.add("total_time", time.monotonic() - started < ns.timeout_s, f"{time.monotonic() - started:.0f} s")
    print(table.render())
    if ns.json:
        Path(ns.json).write_text(json.dumps([r.__dict__ for r in table.rows], indent=2))
    return 1 if any(r.status == "fail" for r in table.rows) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen/Qwen3-0.6B", help="a small model (HF name or checkpoint directory)")
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--sampler", default="TRTLLMSampler", choices=["TRTLLMSampler", "TorchSampler", "auto"],
                   help="sampler_type: TRTLLMSampler (default) checks that penalties, min_p and seed work; "
                        "the others check that the adapter refuses them")
    p.add_argument("--kv-fraction", type=float, default=0.5, help="kv_cache_free_gpu_memory_fraction")
    p.add_argument("--timeout-s", type=float, default=540.0, help="the whole run, start-up included")
    p.add_argument("--fake", action="store_true", help="run on the tests' fake of TensorRT-LLM (CI)")
    p.add_argument("--log", default=None, help="write the sidecar's output here")
    p.add_argument("--json", default=None, help="also write the table as JSON here")
    p.add_argument("--sidecar-arg", action="append", default=[], help="one more sidecar flag (repeatable)")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
