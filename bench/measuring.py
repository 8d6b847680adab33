"""What the benchmarks measure with besides the clock: a free port, a process's CPU time."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
