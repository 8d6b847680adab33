"""Running the launchers (``python -m openengine_adapters.<engine>``) as a user does, in tests, and
the one start/wait/stop of a test's server process (``start_server``, ``stop_server``,
``drain_output``) that the fake (helpers.start_fake) and the vLLM and SGLang sidecars use.

Each launcher runs in its own session, as a terminal's foreground job would (``start_new_session``):
``ctrl_c`` sends SIGINT to its whole process group, as a terminal does. Its output is read in a
thread (SGLang's uvloop policy has no child watcher for asyncio subprocesses).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

try:
    import psutil  # in the engines' environments (a vLLM and SGLang dependency)
except ImportError:  # the engine-free suite: its launchers start no engine processes
    psutil = None

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"ready on .*:(\d+)$")
METRICS = re.compile(r"Prometheus metrics on (http://\S+/metrics)")


def readme_command(engine: str) -> list[str]:
    """The quickstart's run command for ``engine`` (what the README's demo command serves), verbatim (a
    line of a code block in "## Run" of docs/quickstart.md that is ``python -m openengine_adapters.<engine>``
    and nothing else but a comment), as an argv."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    run = text.split("\n## Run\n", 1)[1].split("\n## ", 1)[0]
    wanted = f"python -m openengine_adapters.{engine}"
    for block in re.findall(r"```bash\n(.*?)```", run, re.S):
        for line in block.splitlines():
            if line.split("#", 1)[0].strip() == wanted:
                return [sys.executable, "-m", f"openengine_adapters.{engine}"]
    raise AssertionError(f"docs/quickstart.md's Run section has no line `{wanted}`")


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user who followed the README: none of the test suites' engine knobs."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_TARGET_DEVICE", "VLLM_PLUGINS", "OPENENGINE_GRPC_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


class Launched:
    """A launcher process in its own session; ``lines`` collects its output as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                     env=env if env is not None else user_env(), start_new_session=True,
                                     cwd=str(ROOT))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port: int | None = None
        self.children: list = []

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    async def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """The first output line matching ``pattern`` (fails if the process ends first)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(self.lines):
                if m := regex.search(self.lines[seen].rstrip("\n")):
                    return m
                seen += 1
            if self.proc.poll() is not None and seen >= len(self.lines):
                await asyncio.sleep(0.2)  # the reader may still hold the last lines
                if seen >= len(self.lines):
                    raise AssertionError(f"exited ({self.proc.returncode}) before {pattern!r}:\n{self.tail()}")
            await asyncio.sleep(0.1)
        raise AssertionError(f"no {pattern!r} within {timeout:.0f} s:\n{self.tail()}")

    async def ready(self, timeout: float = 600) -> str:
        """Wait for the server's ready line; returns the loopback target. Records the engine's processes."""
        m = await self.wait_for(READY.pattern, timeout)
        self.port = int(m.group(1))
        self.record_children()
        return f"127.0.0.1:{self.port}"

    def record_children(self) -> None:
        """Remember the processes the launcher has started so far (``leftovers`` checks them)."""
        if psutil is not None:
            with contextlib.suppress(psutil.Error):
                known = {p.pid for p in self.children}
                self.children += [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                                  if p.pid not in known]

    def ctrl_c(self) -> None:
        """SIGINT to the launcher's whole process group, as a terminal's Ctrl-C."""
        os.killpg(self.proc.pid, signal.SIGINT)

    async def wait(self, timeout: float) -> int:
        """The exit code (fails after ``timeout``)."""
        try:
            return await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout:.0f} s:\n{self.tail()}") from None

    def leftovers(self, grace_s: float = 10.0) -> list:
        """Processes the launcher started that are still alive (zombies aside) ``grace_s`` after the
        call: a child gets a moment to see its parent gone (multiprocessing's resource tracker exits
        when its pipe closes), so only a process that outlives the launcher is a leftover."""

        def alive() -> list:
            found = []
            for p in self.children:
                with contextlib.suppress(psutil.Error):
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
            return found

        deadline = time.monotonic() + grace_s
        while (found := alive()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return found

    def last_line_but_exit_notes(self) -> str:
        """The last output line, past the notes engines print at exit on their own (multiprocessing's
        resource tracker freeing shared memory, SGLang's atexit process-tree kill)."""
        notes = ("resource_tracker", "warnings.warn(", "kill_process_tree called")
        lines = [line.strip() for line in self.lines if line.strip() and not any(n in line for n in notes)]
        return lines[-1] if lines else ""

    def tail(self, n: int = 60) -> str:
        return "".join(self.lines[-n:])

    def kill(self) -> None:
        """Clean-up after a failed test: the launcher's group and the processes it started (recorded now
        too: an engine that never got ready, in a process group of its own, would outlive the test)."""
        if self.proc.poll() is None:
            self.record_children()
        for p in self.leftovers(grace_s=0):
            with contextlib.suppress(Exception):
                p.kill()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def engine_process(server: Launched, marker: str):
    """The launcher's child (a psutil.Process) whose name or command line holds ``marker`` (engines title
    their processes: ``VLLM::EngineCore``, ``VLLM::Worker...``, ``sglang::scheduler``)."""
    server.record_children()
    found = []
    for p in server.children:
        with contextlib.suppress(psutil.Error):
            if marker in p.name() or marker in " ".join(p.cmdline()):
                found.append(p)
    assert len(found) == 1, [(p.pid, p.name()) for p in server.children]
    return found[0]


@contextlib.contextmanager
def engine_stopped(process):
    """The engine process stopped (SIGSTOP) for the block, continued after, failing or not: requests sent
    meanwhile wait in its queue, so none can finish before the test has done what it must first (on a
    fast machine the tiny models' streams end in a second)."""
    process.suspend()
    try:
        yield process
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.resume()


def with_root(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH (engine test shims stay behind it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            **(extra or {})}


def spawn_threaded(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A server process whose output is read in a thread (for loops without a child watcher)."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=with_root(env), text=True,
                            bufsize=1)


async def start_server(argv: list[str], *, env: dict[str, str] | None = None, line_timeout: float,
                       threaded: bool = False):
    """The one start-and-wait for a test's server process (the fake, the vLLM or SGLang sidecar):
    start ``argv`` with the checkout on PYTHONPATH, read its output until the ready line; returns
    (process, port, output lines up to and with the ready line). ``threaded``: a ``Popen`` read in
    a thread (SGLang's uvloop policy has no child watcher), else an asyncio subprocess."""
    if threaded:
        proc = spawn_threaded(argv, env)

        def readline():
            return asyncio.to_thread(proc.stdout.readline)
    else:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, env=with_root(env))

        async def readline():
            return (await proc.stdout.readline()).decode()
    lines: list[str] = []
    while True:
        line = await asyncio.wait_for(readline(), line_timeout)
        lines.append(line)
        assert line, f"{argv[1:4]} exited before it was ready:\n" + "".join(lines[-40:])
        if m := READY.search(line.rstrip("\n")):
            return proc, int(m.group(1)), lines


def bench_smoke(script: str, timeout: float, *args: str) -> tuple[str, list[list[str]]]:
    """``python bench/<script> --smoke [args]`` as a user runs it: its output and its table's ``limit`` and
    ``ours`` rows (split), each with tokens/s above 0 (the figures mean nothing at smoke size)."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout, env={**os.environ})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith(("limit ", "ours "))]
    assert all(float(r[2]) > 0 for r in rows), run.stdout  # tokens/s
    return run.stdout, rows


def assert_bench_json_matches_table(path: Path, rows: list[list[str]]) -> dict:
    """The JSON holds, per target and stream count, the medians the table printed (tokens/s to its
    0.1), one window per round, the serving CPU split into server and client, and how it was run."""
    data = json.loads(path.read_text())
    assert data["kind"] == "streaming" and data["command"].startswith("python bench/"), data["command"]
    assert data["machine"]["cpus"] >= 1 and "grpcio" in data["versions"] and data["date"], data
    for name, streams, tps, *_ in rows:
        (window,) = [w for w in data["targets"][name]["windows"] if w["streams"] == int(streams)]
        assert f"{window['median']['tps']:.1f}" == tps, (name, streams, window["median"])
        assert len(window["rounds"]) == data["settings"]["rounds"] == 1
        m = window["median"]
        served = m["cpu_us_per_token"] - m["client_cpu_us_per_token"]
        if data["targets"][name]["server_process"]:
            assert abs(m["server_cpu_us_per_token"] - served) < 1e-6 * m["cpu_us_per_token"], m
        else:
            assert m["server_cpu_us_per_token"] is None and served == 0, m
    return data


def metrics_url(lines: list[str]) -> str:
    """The metrics endpoint a server started with ``--metrics-port 0`` logged before its ready line."""
    urls = [m.group(1) for line in lines if (m := METRICS.search(line))]
    assert urls, "no metrics endpoint in the server's start-up output"
    return urls[-1]


async def stop_server(proc, timeout: float) -> int | None:
    """SIGTERM first (the server drains; a SIGKILLed sidecar would orphan its engine processes),
    SIGKILL after ``timeout``; returns the exit code."""
    threaded = isinstance(proc, subprocess.Popen)
    if (proc.poll() if threaded else proc.returncode) is None:
        proc.terminate()
        try:
            if threaded:
                await asyncio.to_thread(proc.wait, timeout)
            else:
                await asyncio.wait_for(proc.wait(), timeout)
        except (subprocess.TimeoutExpired, TimeoutError):
            proc.kill()
            await (asyncio.to_thread(proc.wait) if threaded else proc.wait())
    return proc.returncode


async def drain_output(proc, sink: list[str] | None = None) -> None:
    """Keep reading a server's output (a full pipe would block it)."""
    threaded = isinstance(proc, subprocess.Popen)
    while line := (await asyncio.to_thread(proc.stdout.readline) if threaded
                   else (await proc.stdout.readline()).decode()):
        if sink is not None:
            sink.append(line)


@contextlib.contextmanager
def listening(host: str = "0.0.0.0", port: int = 0):
    """A plain TCP listener (another server) on ``host:port``; yields its port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a just-closed server's TIME_WAIT is no server
        s.bind((host, port))
        s.listen()
        yield s.getsockname()[1]


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def run_quick(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds) of a command that ends by itself."""
    started = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, env=env if env is not None else user_env(),
                       timeout=timeout, cwd=str(ROOT))
    return p.returncode, p.stdout, p.stderr, time.monotonic() - started


def stderr_lines(stderr: str) -> list[str]:
    """stderr without the noise engines print on import (warnings, Triton notices)."""
    noise = ("Triton", "warnings.warn", "Warning:", "UserWarning", "Ignore import error")
    return [line for line in stderr.splitlines() if line.strip() and not any(n in line for n in noise)]


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and everything it started."""
    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total
