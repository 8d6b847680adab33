"""Soak: minutes of mixed traffic against a server, sampling its main process's memory, fds and threads.

  python bench/soak.py --target fake|vllm|vllm-http [--target ...] [--minutes 30] [--clients 12]
                       [--subscribers 2] [--sample-s 10] [--out bench/results/soak.json] [--trace DIR]
  python bench/plot.py bench/results/soak.json docs/img/soak.png

Targets, all started at once and driven at the same time:
  fake       our server on the fake engine (``tests/serve_fake.py``): the serving layer alone
  vllm       our vLLM sidecar (``python -m openengine_adapters.vllm``), the tiny demo Llama on CPU
  vllm-http  vLLM's own OpenAI HTTP server, same engine flags, the same mix over HTTP (SSE)

Each client runs a bounded loop of requests picked at random (fixed seed), in these shares:
  complete  a Generate read to its end (8-24 tokens)
  cancel    a Generate cancelled by the client after its first message
  deadline  a Generate with a 20-200 ms deadline and 64 tokens (most end DEADLINE_EXCEEDED)
  abort     a Generate stopped by Abort(request_id) after its first message; then Abort of a finished
            id (ALREADY_FINISHED) and of an unknown one (NOT_FOUND)
  v0.1      a Generate on the v0.1.0 surface (Inference.Generate), read to its end
  task      an Embed (refused with FAILED_PRECONDITION by a generate-only model: the refusal path)
Subscribers open SubscribeKvEvents and SubscribeRuntimeEvents in turn, read for 0.2-2 s and cancel.
Over HTTP (vllm-http) the same shares map to a completion read to the end, closed after the first
chunk (cancel and abort: vLLM's HTTP API has no Abort), or cut by a client timeout (deadline); no
subscriptions, no tasks.

Every ``--sample-s`` the sampler records, per target: requests done, the main process's RSS (the
front-end process: our sidecar's, vLLM's API server's; not the engine core's), open fds, threads,
and for ours the request registry from our Prometheus metrics (live requests, remembered finished
ids). The JSON holds every sample and the growth per request after warm-up (a least-squares slope
of RSS over requests done, on the samples after ``--warmup-fraction`` of the run). ``--trace DIR``
runs our servers under tracemalloc (bench/traced_server.py) and prints, at the end, the allocation
sites that grew most between the first sample after warm-up and the last: what each request leaves
behind. Loopback only; the run stops by itself after ``--minutes``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from measuring import free_port
from streaming import ROOT, SIZES, start_server

KINDS = (("complete", 0.58), ("cancel", 0.14), ("deadline", 0.10), ("abort", 0.06), ("v0.1", 0.08),
         ("task", 0.04))
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
CALL_TIMEOUT_S = 30.0  # no single call of the loop may wait longer


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


@dataclass
class Target:
    name: str
    pid: int
    metrics_port: int | None
    trace_dir: str | None
    stop: object
    done: int = 0
    outcomes: dict = field(default_factory=dict)
    samples: list = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # cleared: the loops pause (a quiet snapshot)
    busy: int = 0  # loops inside a request or subscription
    limit: int | None = None  # stop after this many requests (--requests)

    @property
    def finished(self) -> bool:
        return self.limit is not None and self.done >= self.limit

    async def turn(self, until: float) -> bool:
        """Wait while the run is paused; False once it is over. Else the loop is busy until ``note``."""
        await self.gate.wait()
        if time.monotonic() >= until or self.finished:
            return False
        self.busy += 1
        return True

    def note(self, outcome: str, request: bool = True) -> None:
        self.busy -= 1
        self.done += request
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def quiet(self) -> None:
        """Pause the loops and wait until none is inside a request (bounded)."""
        self.gate.clear()
        for _ in range(int((CALL_TIMEOUT_S + 5) / 0.05)):
            if self.busy == 0:
                return
            await asyncio.sleep(0.05)


def proc_status(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def registry_size(port: int) -> dict:
    """Live requests and remembered finished ids, from our Prometheus metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for name, key in (("openengine_admitted_requests", "live_requests"),
                      ("openengine_finished_request_ids", "finished_ids")):
        if m := re.search(rf"^{name} ([0-9.e+]+)$", text, re.M):
            out[key] = float(m.group(1))
    return out


# -- our server over gRPC -----------------------------------------------------------------------

async def grpc_client(target: Target, address: str, model: str, seed: int, until: float, mix=KINDS) -> None:
    import grpc

    from openengine_adapters.v0_1 import generation_pb2 as v01_gen
    from openengine_adapters.v0_1 import openengine_pb2_grpc as v01_grpc
    from openengine_adapters.v1 import embedding_pb2, lifecycle_pb2, tasks_pb2
    from openengine_adapters.v1 import generation_pb2 as g
    from openengine_adapters.v1 import openengine_pb2_grpc as oe_grpc

    rng = random.Random(seed)
    kinds, weights = zip(*mix, strict=True)
    async with grpc.aio.insecure_channel(address) as channel:
        stub, v01 = oe_grpc.OpenEngineStub(channel), v01_grpc.InferenceStub(channel)
        for n in itertools.count():
            if not await target.turn(until):
                return
            kind = rng.choices(kinds, weights)[0]
            rid = f"soak-{seed}-{n}"

            def gen(max_tokens: int, rid: str = rid) -> g.GenerateRequest:
                return g.GenerateRequest(request_id=rid, model=model, prompt=prompt(rng),
                                         stopping=g.StoppingOptions(max_tokens=max_tokens, ignore_eos=True))

            outcome = kind
            try:
                if kind == "complete":
                    async for _ in stub.Generate(gen(rng.randint(8, 24)), timeout=CALL_TIMEOUT_S):
                        pass
                elif kind == "cancel":
                    call = stub.Generate(gen(64), timeout=CALL_TIMEOUT_S)
                    await call.read()
                    call.cancel()
                elif kind == "deadline":
                    async for _ in stub.Generate(gen(64), timeout=rng.uniform(0.02, 0.2)):
                        pass
                elif kind == "abort":
                    call = stub.Generate(gen(64), timeout=CALL_TIMEOUT_S)
                    await call.read()
                    await stub.Abort(lifecycle_pb2.AbortRequest(request_id=rid), timeout=CALL_TIMEOUT_S)
                    while await call.read() is not grpc.aio.EOF:
                        pass
                    await stub.Abort(lifecycle_pb2.AbortRequest(request_id=rid), timeout=CALL_TIMEOUT_S)
                    with contextlib.suppress(grpc.aio.AioRpcError):  # NOT_FOUND
                        await stub.Abort(lifecycle_pb2.AbortRequest(request_id=f"{rid}-unknown"),
                                         timeout=CALL_TIMEOUT_S)
                elif kind == "v0.1":
                    request = v01_gen.GenerateRequest(
                        request_id=rid, model=model, prompt=prompt(rng),
                        stopping=v01_gen.StoppingOptions(max_tokens=rng.randint(8, 24), ignore_eos=True))
                    async for _ in v01.Generate(request, timeout=CALL_TIMEOUT_S):
                        pass
                else:
                    await stub.Embed(embedding_pb2.EmbedRequest(
                        context=tasks_pb2.TaskRequestContext(request_id=rid, model=model),
                        inputs=[tasks_pb2.TaskInput(text=prompt(rng))]), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                outcome = f"{kind}:{exc.code().name}"
            except asyncio.CancelledError:
                raise
            target.note(outcome)


async def subscriber(target: Target, address: str, seed: int, until: float) -> None:
    import grpc

    from openengine_adapters.v1 import kv_pb2, observability_pb2
    from openengine_adapters.v1 import openengine_pb2_grpc as oe_grpc

    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = oe_grpc.OpenEngineStub(channel)
        for n in itertools.count():
            if not await target.turn(until):
                return
            call = (stub.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=bool(n % 4 == 0)))
                    if n % 2 == 0 else
                    stub.SubscribeRuntimeEvents(observability_pb2.SubscribeRuntimeEventsRequest()))
            outcome = "subscription"
            try:
                async with asyncio.timeout(rng.uniform(0.2, 2.0)):
                    async for _ in call:
                        pass
            except TimeoutError:
                pass
            except grpc.aio.AioRpcError as exc:
                outcome = f"subscription:{exc.code().name}"
            call.cancel()
            target.note(outcome, request=False)


async def start_ours(name: str, argv: list[str], trace_dir: str | None) -> tuple[Target, str]:
    metrics_port = free_port()
    if trace_dir is not None:
        trace_dir = os.path.join(trace_dir, name)
        argv = [str(ROOT / "bench" / "traced_server.py"), trace_dir, *argv]
    proc, reader, ready = await start_server(
        [*argv, "--host", "127.0.0.1", "--port", "0", "--metrics-port", str(metrics_port)], r"ready on .*:(\d+)")

    async def stop():
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
        reader.cancel()

    return Target(name, proc.pid, metrics_port, trace_dir, stop), f"127.0.0.1:{ready.group(1)}"


# -- vLLM's own HTTP server -----------------------------------------------------------------------

async def http_client(target: Target, url: str, seed: int, until: float, session, mix=KINDS) -> None:
    import aiohttp

    rng = random.Random(seed)
    kinds, weights = zip(*[(k, w) for k, w in mix if k != "task"], strict=True)
    for _ in itertools.count():
        if not await target.turn(until):
            return
        kind = rng.choices(kinds, weights)[0]
        max_tokens = rng.randint(8, 24) if kind in ("complete", "v0.1") else 64
        body = {"model": "m", "prompt": prompt(rng), "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        timeout = aiohttp.ClientTimeout(total=rng.uniform(0.02, 0.2) if kind == "deadline" else CALL_TIMEOUT_S)
        outcome = kind
        try:
            async with session.post(url, json=body, timeout=timeout) as resp:
                resp.raise_for_status()
                async for line in resp.content:
                    if kind in ("cancel", "abort") and line.startswith(b"data: "):
                        resp.close()  # the client goes away after the first chunk
                        break
        except (TimeoutError, aiohttp.ClientError) as exc:
            outcome = f"{kind}:{type(exc).__name__}"
        target.note(outcome)


async def start_vllm_http(flags: list[str]) -> tuple[Target, str]:
    port = free_port()
    proc, reader, _ = await start_server(
        ["-m", "vllm.entrypoints.openai.api_server", *flags, "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", "m", "--disable-uvicorn-access-log"], r"Application startup complete")

    async def stop():
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
        reader.cancel()

    return Target("vllm-http", proc.pid, None, None, stop), f"http://127.0.0.1:{port}/v1/completions"


# -- the run ---------------------------------------------------------------------------------------

def vllm_flags(model: str, max_seqs: int) -> list[str]:
    return ["--model", model, "--enforce-eager", "--max-model-len", "512", "--dtype", "float32",
            "--max-num-seqs", str(max_seqs), "--seed", "0"]


async def sample(target: Target, t0: float) -> None:
    row = {"t_s": round(time.monotonic() - t0, 2), "requests": target.done}
    try:
        row.update(proc_status(target.pid))
    except FileNotFoundError:
        raise RuntimeError(f"{target.name}: the server process {target.pid} is gone") from None
    if target.metrics_port is not None:
        with contextlib.suppress(OSError):
            row.update(await asyncio.to_thread(registry_size, target.metrics_port))
    if target.trace_dir is not None:
        before = set(os.listdir(target.trace_dir)) if os.path.isdir(target.trace_dir) else set()
        os.kill(target.pid, signal.SIGUSR2)
        for _ in range(600):  # a snapshot of a large heap takes a while; bounded
            await asyncio.sleep(0.1)
            now = set(os.listdir(target.trace_dir)) if os.path.isdir(target.trace_dir) else set()
            if now - before:
                await asyncio.sleep(0.5)  # the dump finishes writing
                row["snapshot"] = sorted(now - before)[0]
                break
    target.samples.append(row)


def slope_bytes_per_request(samples: list[dict], warmup_fraction: float) -> float | None:
    """Least-squares slope of RSS over requests done, on the samples after warm-up."""
    if not samples:
        return None
    end = samples[-1]["t_s"]
    rows = [s for s in samples if s["t_s"] >= warmup_fraction * end]
    if len(rows) < 3:
        return None
    xs, ys = [s["requests"] for s in rows], [s["rss_mib"] * 1024 * 1024 for s in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else None


def report(args, mix, targets: list[Target], final: bool) -> dict:
    """The run so far as JSON, written to ``--out`` (after every sample: a long run that is stopped keeps
    its curves); the final one adds the tracemalloc comparison and prints a summary."""
    result = {"kind": "soak", "minutes": args.minutes, "clients": args.clients, "subscribers": args.subscribers,
              "mix": dict(mix), "warmup_fraction": args.warmup_fraction, "server_flags": args.server_flag,
              "targets": {}}
    for t in targets:
        slope = slope_bytes_per_request(t.samples, args.warmup_fraction)
        entry = {"requests": t.done, "outcomes": dict(sorted(t.outcomes.items())), "samples": t.samples,
                 "rss_bytes_per_request_after_warmup": slope}
        if final and t.trace_dir is not None:
            entry["tracemalloc_top_growth"] = top_growth(t, args.warmup_fraction)
        result["targets"][t.name] = entry
        if not final:
            continue
        print(f"{t.name}: {t.done} requests, RSS {t.samples[0]['rss_mib']:.1f} -> {t.samples[-1]['rss_mib']:.1f} MiB, "
              f"after warm-up {slope if slope is None else round(slope, 1)} bytes/request")
        for row in entry.get("tracemalloc_top_growth", []):
            site = row["site"] if isinstance(row["site"], str) else "\n      ".join(row["site"])
            print(f"  {row['bytes_per_request']:>9} B/req  {site}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if final:
        print(f"wrote {args.out}")
    return result


def top_growth(target: Target, warmup_fraction: float, limit: int = 15) -> list[dict]:
    """The allocation sites that grew most from the quiet snapshot at the end of warm-up (no request in
    flight) to the last one (the loops have ended): what the requests between them left behind."""
    import tracemalloc

    snaps = [s for s in target.samples if "snapshot" in s]
    quiet = [s for s in snaps if s.get("quiet")]
    if not quiet or snaps[-1] is quiet[0]:
        return []
    first, last = quiet[0], snaps[-1]
    requests = max(1, last["requests"] - first["requests"])
    a = tracemalloc.Snapshot.load(os.path.join(target.trace_dir, first["snapshot"]))
    b = tracemalloc.Snapshot.load(os.path.join(target.trace_dir, last["snapshot"]))
    total = sum(st.size for st in b.statistics("filename")) - sum(st.size for st in a.statistics("filename"))
    out = [{"bytes_per_request": round(total / requests, 2), "site": "all traced memory"}]
    for stat in b.compare_to(a, "traceback")[:limit]:
        out.append({"bytes_per_request": round(stat.size_diff / requests, 2), "count_diff": stat.count_diff,
                    "site": stat.traceback.format(limit=8)})
    return out


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", choices=("fake", "vllm", "vllm-http"), required=True)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=12, help="concurrent request loops per target")
    p.add_argument("--subscribers", type=int, default=2, help="concurrent subscription loops per gRPC target")
    p.add_argument("--only", nargs="+", choices=[k for k, _ in KINDS], default=None,
                   help="request kinds to send (default: the whole mix): which kind leaves memory behind")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--warmup-fraction", type=float, default=0.25)
    p.add_argument("--requests", type=int, default=None,
                   help="stop once each target has served this many requests (--minutes stays the limit)")
    p.add_argument("--warmup-requests", type=int, default=0,
                   help="with --trace: the quiet snapshot waits for this many requests per target too")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help="the demo Llama built for vLLM")
    p.add_argument("--model", default=None, help="a model directory for vLLM (default: built from --size)")
    p.add_argument("--server-flag", action="append", default=[], help="one more flag for our servers")
    p.add_argument("--trace", default=None, metavar="DIR", help="run our servers under tracemalloc")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak.json"))
    p.add_argument("--fail-above", type=float, default=None, metavar="BYTES",
                   help="exit 1 if a gRPC target grew more than BYTES per request after warm-up (traced memory "
                        "with --trace, else RSS): the CI check (tests/test_soak.py)")
    args = p.parse_args()

    targets: list[Target] = []
    loops = []
    until = None
    try:
        started = []
        for name in args.target:
            if name == "fake":
                started.append(("fake", await start_ours("fake", [str(ROOT / "tests" / "serve_fake.py"),
                                                                  *args.server_flag], args.trace), "tiny"))
                continue
            if args.model is None:
                import tempfile

                from openengine_adapters.demo_model import build_tiny_llama
                args.model = str(build_tiny_llama(Path(tempfile.gettempdir()) / f"openengine-bench-llama-{args.size}",
                                                  **SIZES[args.size]))
            os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            flags = vllm_flags(args.model, max(16, args.clients))
            if name == "vllm":
                started.append(("vllm", await start_ours("vllm", ["-m", "openengine_adapters.vllm", *flags,
                                                                  *args.server_flag], args.trace), args.model))
            else:
                started.append(("vllm-http", await start_vllm_http(flags), "m"))
        session = None
        if any(name == "vllm-http" for name, _, _ in started):
            import aiohttp

            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        mix = tuple((k, w) for k, w in KINDS if args.only is None or k in args.only)
        t0 = time.monotonic()
        until = t0 + args.minutes * 60
        for i, (name, (target, address), model) in enumerate(started):
            targets.append(target)
            for c in range(args.clients):
                seed = 1000 * i + c
                if name == "vllm-http":
                    loops.append(asyncio.ensure_future(http_client(target, address, seed, until, session, mix)))
                else:
                    loops.append(asyncio.ensure_future(grpc_client(target, address, model, seed, until, mix)))
            if name != "vllm-http":
                for s in range(args.subscribers if args.only is None else 0):
                    loops.append(asyncio.ensure_future(subscriber(target, address, 500 + s, until)))
        for t in targets:
            t.gate.set()
            t.limit = args.requests
        warm_until = t0 + args.warmup_fraction * args.minutes * 60 if args.trace else None
        while time.monotonic() < until and not all(t.finished for t in targets):
            if warm_until is not None and time.monotonic() >= warm_until \
                    and all(t.done >= args.warmup_requests for t in targets):
                warm_until = None
                for t in targets:
                    await t.quiet()
                    await sample(t, t0)
                    t.samples[-1]["quiet"] = True
                    t.gate.set()
            else:
                for t in targets:
                    await sample(t, t0)
            print(" | ".join(f"{t.name}: {t.done} req, {t.samples[-1]['rss_mib']:.1f} MiB" for t in targets),
                  flush=True)
            report(args, mix, targets, final=False)
            failed = [f for f in loops if f.done() and f.exception() is not None]
            if failed:
                raise failed[0].exception()
            for _ in range(max(1, int(args.sample_s / 0.1))):  # the next sample, or the end of the run
                if time.monotonic() >= until or all(t.finished for t in targets):
                    break
                await asyncio.sleep(0.1)
        await asyncio.wait(loops, timeout=CALL_TIMEOUT_S + 5)
        for t in targets:
            await sample(t, t0)
            t.samples[-1]["quiet"] = True
        if session is not None:
            await session.close()
    finally:
        for f in loops:
            f.cancel()
        for t in targets:
            await t.stop()

    result = report(args, mix, targets, final=True)
    if args.fail_above is not None:
        for name, entry in result["targets"].items():
            traced = entry.get("tracemalloc_top_growth")
            growth = traced[0]["bytes_per_request"] if traced else entry["rss_bytes_per_request_after_warmup"]
            if name != "vllm-http" and (growth is None or growth > args.fail_above):
                print(f"FAIL {name}: {growth} bytes per request after warm-up, above {args.fail_above:g}")
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
