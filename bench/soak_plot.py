"""Draw a soak's curves (bench/soak.py's JSON) to a PNG: RSS, open fds, threads and the request registry
of each target's main process over the requests it served.

  python bench/soak_plot.py bench/results/soak.json docs/img/soak.png

matplotlib is needed here only (``pip install matplotlib``, or the project's ``bench`` extra).
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"vllm": "ours: vLLM sidecar (gRPC)", "vllm-http": "vLLM's own OpenAI HTTP server",
          "fake": "ours: fake engine (gRPC)"}


def main(source: str, out: str) -> None:
    data = json.loads(open(source).read())
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
    fig.suptitle(f"Soak: {data['minutes']:g} min of mixed traffic, {data['clients']} clients per server, "
                 f"{data['subscribers']} subscription loops (gRPC)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
