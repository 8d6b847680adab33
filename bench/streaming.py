"""The shared harness of the streaming benchmarks (vllm_streaming.py, sglang_streaming.py).

Targets are ways of streaming from one engine configuration; ``run`` starts them all, measures
them in interleaved rounds (each round visits every (streams, target) window, the targets in a
rotating order), prints the medians and the median of per-round ratios, and with ``--json PATH``
writes every round's figures too (bench/plot.py draws them). See either bench's docstring for what
is measured and why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from measuring import process_cpu_s, write_results

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT_IDS = [1, 275, 340, 88, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311]
SIZES = {  # build_tiny_llama keyword arguments
    "tiny": {},
    "small": {"vocab_size": 8192, "hidden_size": 512, "layers": 8, "heads": 8, "kv_heads": 8},
}


@dataclass
class Window:
    tps: float
    ttft_ms: float
    ttft_p99_ms: float
    itl_ms: float
    itl_p99_ms: float
    tokens_per_message: float
    cpu_us_per_token: float  # serving CPU: the server process's (if any) plus this, the client's
    server_cpu_us_per_token: float | None  # None: served in this process (the limit)
    client_cpu_us_per_token: float


@dataclass
class Stream:
    """One request as the client saw it: when the first token came, every token-carrying message's
    arrival time, and the tokens."""
    start: float
    arrivals: list[float] = field(default_factory=list)
    tokens: int = 0

    def got(self, n: int) -> None:
        if n:
            self.arrivals.append(time.perf_counter())
            self.tokens += n

    @property
    def ttft(self) -> float:
        return self.arrivals[0] - self.start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Target:
    """One way of streaming from the engine: ``one()`` runs one request and returns its ``Stream``;
    ``server_pid`` is the process whose CPU serves it (None: this one)."""
    name: str
    one: object
    server_pid: int | None = None
    close: object = None
    windows: dict[int, list[Window]] = field(default_factory=dict)


async def measure(target: Target, concurrency: int, seconds: float) -> Window:
    """Keep ``concurrency`` streams in flight for ``seconds`` (plus the stragglers' ends)."""
    await asyncio.gather(*(target.one() for _ in range(min(concurrency, 4))))  # warm-up
    results: list[Stream] = []
    cpu0 = time.process_time()
    server0 = process_cpu_s(target.server_pid) if target.server_pid else 0.0
    start = time.perf_counter()

    async def worker():
        while time.perf_counter() - start < seconds:
            results.append(await target.one())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - cpu0
    server_cpu = process_cpu_s(target.server_pid) - server0 if target.server_pid else None
    tokens = sum(s.tokens for s in results)
    messages = sum(len(s.arrivals) for s in results)
    ttfts = [s.ttft * 1000 for s in results]
    gaps = [(b - a) * 1000 for s in results for a, b in zip(s.arrivals, s.arrivals[1:], strict=False)]
    return Window(tokens / elapsed, statistics.median(ttfts), percentile(ttfts, 0.99), percentile(gaps, 0.5),
                  percentile(gaps, 0.99), tokens / messages, (client_cpu + (server_cpu or 0.0)) / tokens * 1e6,
                  None if server_cpu is None else server_cpu / tokens * 1e6, client_cpu / tokens * 1e6)


async def start_server(argv: list[str], ready: str, env: dict | None = None):
    """Start a server child process; return (process, output reader, the ready line's match)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
             **(env or {})})
    tail = []
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 600)).decode(errors="replace")
        if not line:
            raise RuntimeError("server exited:\n" + "".join(tail[-30:]))
        tail.append(line)
        if match := re.search(ready, line):
            break

    async def drain():
        while await proc.stdout.readline():
            pass

    return proc, asyncio.ensure_future(drain()), match


def closer(proc, reader, channel):
    async def close():
        await channel.close()
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
        reader.cancel()
    return close


# our sidecar three ways: at its defaults (adaptive coalescing), coalescing off, and always grouping
# (a loop-CPU threshold of 0: every stream holds its tokens for the whole max delay)
OURS = {"ours": [], "ours-nocoal": ["--coalesce-max-delay-ms", "0"], "ours-grouped": ["--coalesce-loop-cpu", "0"]}


async def openengine_target(engine: str, flags: list[str], tokens: int, name: str = "ours", *,
                            server: list[str] | None = None, metadata: dict[str, str] | None = None,
                            vocabulary: int | None = None) -> Target:
    """Our sidecar as ``name`` (a key of ``OURS``) plus $OPENENGINE_BENCH_OURS_FLAGS if set;
    ``server`` replaces ``-m openengine_adapters.<engine>``, ``metadata`` goes in every request,
    and the prompt's ids are taken modulo ``vocabulary`` when given."""
    import grpc

    from openengine_adapters.v1 import generation_pb2 as g
    from openengine_adapters.v1 import input_pb2, openengine_pb2_grpc

    ours = OURS[name] + shlex.split(os.environ.get("OPENENGINE_BENCH_OURS_FLAGS", ""))
    proc, reader, ready = await start_server(  # port 0: the engine's own sockets may take a pre-picked port
        [*(server or ["-m", f"openengine_adapters.{engine}"]), *flags, *ours, "--host", "127.0.0.1", "--port", "0"],
        r"ready on .*:(\d+)")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{ready.group(1)}")
    stub = openengine_pb2_grpc.OpenEngineStub(channel)
    ids = PROMPT_IDS if vocabulary is None else [i % vocabulary for i in PROMPT_IDS]
    request = g.GenerateRequest(token_ids=input_pb2.TokenIds(ids=ids), sampling=g.SamplingParams(temperature=0.0),
                                stopping=g.StoppingOptions(max_tokens=tokens, ignore_eos=True), metadata=metadata)

    async def one():
        s = Stream(time.perf_counter())
        async for resp in stub.Generate(request):
            if resp.HasField("token"):
                s.got(len(resp.token.tokens))
        return s

    return Target(name, one, proc.pid, closer(proc, reader, channel))


def ours_makers(engine: str) -> dict:
    """A target maker per way of running our sidecar (``OURS``), for a bench's MAKERS."""
    def maker(name: str):
        async def make(flags: list[str], tokens: int) -> Target:
            return await openengine_target(engine, flags, tokens, name)
        return make
    return {name: maker(name) for name in OURS}


METRICS = (("tps", "tokens/s", ".1f"), ("ttft_ms", "TTFT p50", ".1f"), ("ttft_p99_ms", "TTFT p99", ".1f"),
           ("itl_ms", "ITL p50", ".2f"), ("itl_p99_ms", "ITL p99", ".2f"),
           ("tokens_per_message", "tok/msg", ".2f"), ("cpu_us_per_token", "CPU us/tok", ".1f"))


def paired_ratios(a: Target, b: Target, c: int, attr: str) -> list[float]:
    """``a``'s figure over ``b``'s, round by round (the two windows of a round ran seconds apart), sorted."""
    return sorted(getattr(x, attr) / getattr(y, attr) for x, y in zip(a.windows[c], b.windows[c], strict=True))


def report(targets: list[Target], levels: list[int], rounds: int, model: str, tokens: int,
           stream_interval: int, ratios: tuple[tuple[str, str, str], ...]) -> None:
    print(f"\nmodel {model}; streams of {tokens} tokens, prompt {len(PROMPT_IDS)} tokens, "
          f"stream interval {stream_interval}; medians over {rounds} interleaved rounds (latencies in ms)\n")
    print(f"{'target':<12} {'streams':>7} " + " ".join(f"{label:>10}" for _, label, _ in METRICS))
    for t in targets:
        for c in levels:
            w = t.windows[c]
            values = (statistics.median(getattr(x, attr) for x in w) for attr, _, _ in METRICS)
            print(f"{t.name:<12} {c:>7} " + " ".join(f"{v:>10{fmt}}" for v, (_, _, fmt) in zip(values, METRICS,
                                                                                               strict=True)))
    by = {t.name: t for t in targets}

    def paired(a: str, b: str, c: int, attr: str) -> str:
        if a not in by or b not in by:
            return "-"
        ratios = paired_ratios(by[a], by[b], c, attr)
        return f"{statistics.median(ratios):.3f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"

    print("\nratios: median of the per-round ratios [lowest-highest]")
    names = [f"{a}/{b} {attr.split('_')[0] if attr != 'itl_p99_ms' else 'itl_p99'}" for a, b, attr in ratios]
    print(f"{'streams':>7} " + " ".join(f"{n:>26}" for n in names))
    for c in levels:
        print(f"{c:>7} " + " ".join(f"{paired(a, b, c, attr):>26}" for a, b, attr in ratios))


ENGINE_TITLES = ("VLLM::", "sglang::")  # how the engines title their processes (engine cores, workers, schedulers)


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus``, as ``taskset -a -p`` does (threads started later inherit)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def pin_split(targets: list[Target]) -> dict:
    """The engines on the first usable CPU, every front end (the servers' own processes and this
    client) on the others: what our layer costs, seen apart from the CPU engine's busy-waiting."""
    import psutil  # an engine dependency

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least two usable CPUs")
    engine_cpus, front_cpus = {cpus[0]}, set(cpus[1:])
    me = psutil.Process()
    roots = [me] + [psutil.Process(t.server_pid) for t in targets if t.server_pid]
    engines, fronts = set(), {p.pid for p in roots}
    for root in roots:
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                (engines if child.name().startswith(ENGINE_TITLES) else fronts).add(child.pid)
    for pid in engines:
        set_affinity(pid, engine_cpus)
    for pid in fronts:
        set_affinity(pid, front_cpus)
    return {"engine_cpus": sorted(engine_cpus), "front_end_cpus": sorted(front_cpus),
            "engine_processes": len(engines), "front_end_processes": len(fronts)}


def parser(doc: str, makers: dict) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a model directory (default: built from --size)")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="length of one measuring window")
    p.add_argument("--skip", nargs="*", default=[], choices=sorted(makers))
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="one short round, limit and ours only (CI)")
    p.add_argument("--pin", action="store_true",
                   help="engine processes on the first usable CPU, the servers and this client on the others "
                        "(taskset -a): what the front ends cost, apart from the CPU engine's busy-waiting")
    p.add_argument("--json", metavar="PATH", help="also write every round's figures, the machine, the versions, "
                   "the command and the date as JSON (bench/plot.py streaming draws it)")
    return p


def median_or_none(values: list) -> float | None:
    """None when a figure was not measured (no server process; no gap between two messages: NaN)."""
    return None if None in values or any(v != v for v in values) else statistics.median(values)


def null_nan(window: dict) -> dict:
    return {k: None if v != v else v for k, v in window.items()}  # NaN is no JSON value


def results(targets: list[Target], levels: list[int], ratios: tuple[tuple[str, str, str], ...]) -> dict:
    """The figures of ``report`` as data: per target and stream count the medians and every round's
    window, then each ratio's median and range over the per-round ratios."""
    by = {t.name: t for t in targets}

    def level(t: Target, c: int) -> dict:
        rounds = [null_nan(asdict(w)) for w in t.windows[c]]
        return {"streams": c, "median": {k: median_or_none([w[k] for w in rounds]) for k in rounds[0]},
                "rounds": rounds}

    out = {"targets": {t.name: {"server_process": t.server_pid is not None,
                                "windows": [level(t, c) for c in levels]} for t in targets},
           "ratios": []}
    for a, b, attr in ratios:
        if a in by and b in by:
            for c in levels:
                r = paired_ratios(by[a], by[b], c, attr)
                out["ratios"].append({"of": a, "to": b, "metric": attr, "streams": c,
                                      "median": statistics.median(r), "low": r[0], "high": r[-1]})
    return out


def model_dir(args) -> str:
    if args.model is not None:
        return args.model
    from openengine_adapters.demo_model import build_tiny_llama

    return str(build_tiny_llama(Path(tempfile.gettempdir()) / f"openengine-bench-llama-{args.size}",
                                **SIZES[args.size]))


async def run(args, makers: dict, optional: dict[str, str], flags: list[str], model: str,
              ratios: tuple[tuple[str, str, str], ...], settings: dict | None = None) -> None:
    """Start every target not skipped, measure in interleaved rounds, report, stop them all;
    ``settings`` adds to (or overrides) what --json records of how the bench was run."""
    if args.smoke:
        args.concurrency, args.rounds, args.seconds, args.tokens = [1, 4], 1, 0.5, 8
        args.skip = [k for k in makers if k not in ("limit", "ours")]
    targets: list[Target] = []
    pinned = None
    try:
        for key, make in makers.items():
            if key in args.skip:
                continue
            try:
                targets.append(await make(flags, args.tokens))
            except ImportError:
                if key not in optional:
                    raise
                print(f"{key} skipped: {optional[key]}", file=sys.stderr)
        pinned = pin_split(targets) if args.pin else None
        if pinned:
            print(f"pinned: {pinned}", file=sys.stderr, flush=True)
        for r in range(args.rounds):
            for c in args.concurrency:
                for i in range(len(targets)):
                    t = targets[(i + r) % len(targets)]
                    t.windows.setdefault(c, []).append(await measure(t, c, args.seconds))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for t in targets:
            if t.close is not None:
                await t.close()
    report(targets, args.concurrency, args.rounds, model, args.tokens, args.stream_interval, ratios)
    if args.json:
        settings = {"model": model, "size": None if args.model else getattr(args, "size", None),
                    "tokens": args.tokens, "prompt_tokens": len(PROMPT_IDS), "stream_interval": args.stream_interval,
                    "rounds": args.rounds, "seconds": args.seconds, "concurrency": args.concurrency,
                    "ours_extra_flags": os.environ.get("OPENENGINE_BENCH_OURS_FLAGS", ""), "pinned": pinned,
                    **(settings or {})}
        write_results(args.json, "streaming", settings, results(targets, args.concurrency, ratios))
