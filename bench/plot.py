"""Draw a bench's JSON results to a PNG for the documentation (docs/img/), the kind read from the JSON:

  python bench/plot.py bench/results/vllm-streaming-tiny.json docs/img/perf-vllm-tiny.png
  python bench/plot.py bench/results/soak-vllm-30min.json docs/img/soak.png

- ``streaming`` (vllm_streaming.py, sglang_streaming.py, frontend_ceiling.py ``--json``): per target,
  against the number of concurrent streams, tokens/s, TTFT and inter-token latency p50/p99, tokens
  per message, server and client CPU per token, and the tokens/s ratios of ours to the others; each
  point a median over the rounds, its bar the lowest and highest round;
- ``floor`` (grpc_floor.py ``--json``): messages/s and CPU per message of a bare grpc.aio server;
- ``soak`` (soak.py ``--out``; files without a kind are soaks, written before it had one): RSS, open
  fds, threads and the request registry of each target's main process over the run.

Each figure carries the command, the machine, the date and the commit its JSON records. matplotlib is
needed here only (the project's ``bench`` extra, ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

LABELS = {"vllm": "ours: vLLM sidecar (gRPC)", "vllm-http": "vLLM's own OpenAI HTTP server",
          "fake": "ours: fake engine (gRPC)", "limit": "limit (in process, no transport)",
          "ours": "ours (defaults: adaptive coalescing)", "ours-nocoal": "ours, coalescing off",
          "ours-grouped": "ours, always grouping", "vllm-grpc": "vLLM's own gRPC server",
          "sglang-http": "SGLang's own HTTP server"}
COLORS = {"limit": "0.35", "ours": "tab:blue", "ours-nocoal": "tab:cyan", "ours-grouped": "tab:purple",
          "vllm-grpc": "tab:orange", "vllm-http": "tab:red", "sglang-http": "tab:red"}


def provenance(data: dict) -> str:
    """One footer line or two: what ran, on what, when, from which commit (what the JSON records)."""
    if "command" not in data:
        return ""
    m, v = data["machine"], data["versions"]
    machine = f"{m['cpus_usable']} of {m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']:g} GiB, {m['arch']}, " \
              f"Python {m['python']}"
    versions = ", ".join(f"{k} {x}" for k, x in v.items() if k != "openengine-adapters")
    commit = (data.get("commit") or "?")[:12] + ("+dirty" if (data.get("commit") or "").endswith("+dirty") else "")
    if load := m.get("load_average_1_5_15_min"):
        machine += f", load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end"
    return textwrap.fill(f"{data['command']}   |   {data['date']}, commit {commit}   |   {machine}; {versions}", 190)


def finish(fig, data: dict, title: str, out: str) -> None:
    fig.suptitle(title)
    footer = provenance(data)
    fig.tight_layout(rect=(0, 0.025 * (footer.count("\n") + 1) if footer else 0, 1, 1))
    if footer:
        fig.text(0.01, 0.005, footer, fontsize=7, color="0.35", va="bottom", family="monospace")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out}")


def streams_axis(ax, levels: list[int], title: str, ylabel: str, log_y: bool = False) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    if log_y:
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "25" else ""))
    ax.set_title(title)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def spread(windows: list[dict], key: str) -> tuple[list[int], list[float], list[list[float]]] | None:
    """x, median and (below, above) error bars from the rounds, at the stream counts where the figure was
    measured (a target served in the bench's own process has no server CPU; a stream sent in one message
    no inter-token gap), or None when it never was."""
    def value(x):  # JSON null (and NaN from results written before null) both mean "not measured"
        return None if x is None or x != x else x

    rows = [(w["streams"], value(w["median"][key]), [v for r in w["rounds"] if (v := value(r[key])) is not None])
            for w in windows]
    rows = [(x, m, vs) for x, m, vs in rows if m is not None and vs]
    if not rows:
        return None
    return ([x for x, _, _ in rows], [m for _, m, _ in rows],
            [[m - min(vs) for _, m, vs in rows], [max(vs) - m for _, m, vs in rows]])


def draw_streaming(data: dict, out: str) -> None:
    s = data["settings"]
    levels = s["concurrency"]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5))
    (tps, ttft, itl), (tpm, cpu, ratio) = axes
    for name, t in data["targets"].items():
        color, label = COLORS.get(name), LABELS.get(name, name)
        w = t["windows"]
        for ax, key, style, lab in ((tps, "tps", "-o", label), (tpm, "tokens_per_message", "-o", label),
                                    (ttft, "ttft_ms", "-o", f"{name} p50"), (ttft, "ttft_p99_ms", ":^", f"{name} p99"),
                                    (itl, "itl_ms", "-o", f"{name} p50"), (itl, "itl_p99_ms", ":^", f"{name} p99")):
            if got := spread(w, key):
                ax.errorbar(*got[:2], yerr=got[2], fmt=style, color=color, label=lab, capsize=3, ms=4)
        if t["server_process"]:
            for key, style, part in (("server_cpu_us_per_token", "-o", "server"),
                                     ("client_cpu_us_per_token", ":^", "client")):
                if got := spread(w, key):
                    cpu.errorbar(*got[:2], yerr=got[2], fmt=style, color=color, label=f"{name} {part}", capsize=3,
                                 ms=4)
        elif got := spread(w, "cpu_us_per_token"):
            cpu.errorbar(*got[:2], yerr=got[2], fmt="-s", color=color, label=f"{name} (one process)", capsize=3, ms=4)
    shown = [r for r in data["ratios"] if r["metric"] == "tps"]
    for (a, b) in dict.fromkeys((r["of"], r["to"]) for r in shown):
        rows = [r for r in shown if (r["of"], r["to"]) == (a, b)]
        ratio.errorbar([r["streams"] for r in rows], [r["median"] for r in rows], capsize=3, ms=4, fmt="-o",
                       yerr=[[r["median"] - r["low"] for r in rows], [r["high"] - r["median"] for r in rows]],
                       color=COLORS.get(b if a == "ours" else a), label=f"{a} / {b}")
    ratio.axhline(1.0, color="0.5", lw=0.8)
    streams_axis(tps, levels, "throughput", "tokens/s")
    streams_axis(ttft, levels, "time to first token, p50 (solid) and p99 (dotted)", "ms", log_y=True)
    streams_axis(itl, levels, "inter-token latency, p50 and p99 (dotted)", "ms", log_y=True)
    streams_axis(tpm, levels, "tokens per message", "tokens")
    streams_axis(cpu, levels, "CPU per token: server (solid), client (dotted)", "µs", log_y=True)
    streams_axis(ratio, levels, "tokens/s ratio, median of per-round ratios", "ratio")
    tps.legend(fontsize=8)
    for ax in (ttft, itl, cpu, ratio):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, ncol=2 if len(ax.get_legend_handles_labels()[0]) > 6 else 1)
    model = f"{s['size']} model" if s.get("size") else s["model"]
    finish(fig, data, f"{data['bench']}: {model}, {s['tokens']}-token streams, {s['prompt_tokens']}-token prompt, "
           f"{s['rounds']} interleaved rounds of {s['seconds']:g}-s windows (bars: lowest and highest round)"
           + (f"\nengines pinned to CPU {s['pinned']['engine_cpus']}, servers and client to "
              f"{s['pinned']['front_end_cpus']}" if s.get("pinned") else ""), out)


def draw_floor(data: dict, out: str) -> None:
    s, rows = data["settings"], data["rows"]
    levels = [r["streams"] for r in rows]
    fig, (rate, cpu) = plt.subplots(1, 2, figsize=(12, 5))
    rate.plot(levels, [r["messages_per_s"] for r in rows], "-o")
    for key, label in (("server_cpu_us_per_message", "server"), ("client_cpu_us_per_message", "client")):
        cpu.plot(levels, [r[key] for r in rows], "-o", label=label)
    streams_axis(rate, levels, "messages/s", "messages/s")
    streams_axis(cpu, levels, "CPU per message", "µs")
    cpu.set_ylim(bottom=0)
    cpu.legend()
    finish(fig, data, f"a bare grpc.aio stream: one {s['tokens']}-message call per stream, a message every "
           f"{s['step_ms']:g} ms, {s['seconds']:g}-s windows", out)


def draw_soak(data: dict, out: str) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (rss, fds), (threads, registry) = axes
    live = registry.twinx()
    for name, t in data["targets"].items():
        s = t["samples"]
        minutes = [x["t_s"] / 60 for x in s]
        slope = t.get("rss_bytes_per_request_after_warmup")
        label = f"{LABELS.get(name, name)} ({t['requests']:,} requests"
        label += f", {slope:+.1f} B/request after warm-up)" if slope is not None else ")"
        rss.plot(minutes, [x["rss_mib"] for x in s], label=label)
        fds.plot(minutes, [x["fds"] for x in s], label=LABELS.get(name, name))
        threads.plot(minutes, [x["threads"] for x in s], label=LABELS.get(name, name))
        if any("live_requests" in x for x in s):
            registry.plot(minutes, [x.get("finished_ids") for x in s], label=f"{name}: finished ids remembered (left)")
            live.plot(minutes, [x.get("live_requests") for x in s], color="tab:red", alpha=0.6,
                      label=f"{name}: live requests (right)")
    warm = data["warmup_fraction"] * data["minutes"]
    for ax, title in ((rss, "main process RSS (MiB)"), (fds, "open file descriptors"), (threads, "threads"),
                      (registry, "request registry (ours)")):
        ax.set_title(title)
        ax.set_xlabel("minutes")
        ax.axvspan(0, warm, color="0.92", zorder=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    if live.lines:
        live.legend(fontsize=8, loc="lower right")
    rss.text(warm / 2, rss.get_ylim()[0], "warm-up", ha="center", va="bottom", fontsize=8, color="0.4")
    finish(fig, data, f"Soak: {data['minutes']:g} min of mixed traffic, {data['clients']} clients per server, "
           f"{data['subscribers']} subscription loops (gRPC)", out)


DRAW = {"streaming": draw_streaming, "floor": draw_floor, "soak": draw_soak}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source, out = argv
    data = json.loads(open(source).read())
    kind = data.get("kind", "soak")
    if kind not in DRAW:
        print(f"{source}: unknown kind {kind!r} (known: {', '.join(DRAW)})", file=sys.stderr)
        return 2
    DRAW[kind](data, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
