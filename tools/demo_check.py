"""CI's check that the README's demo serves: run in the environment `nox -s demo` builds (the
`vllm` session builds it the same way, first), start the demo launcher as the demo session does (on a
free port), wait for its ready line, talk to it with the `openengine` CLI, stop it with SIGTERM.

Fails (exit 1, naming what) on: no ready line within the bound, a CLI call that does not succeed, a
traceback or a `nanobind: leaked` line in the launcher's output, a non-zero exit after SIGTERM.
Prints the seconds to ready and the launcher's output line count before the ready line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

READY = re.compile(r"ready on .*:(\d+)$")
START_BOUND_S = 900.0  # a cold start on a busy 2-core machine


def main() -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_TARGET_DEVICE", "VLLM_CPU_KVCACHE_SPACE")}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "openengine_adapters.vllm", "--port", "0", *sys.argv[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()
    port: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            m = READY.search(lines[-1])
            if m and not ready.is_set():
                port.append(m.group(1))
                ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    problems: list[str] = []
    try:
        if not ready.wait(START_BOUND_S) or not port:
            problems.append(f"no ready line within {START_BOUND_S:.0f} s (exit {proc.poll()})")
        else:
            print(f"demo_check: ready after {time.monotonic() - started:.1f} s, "
                  f"{len(lines) - 1} launcher lines before the ready line", flush=True)
            target = f"127.0.0.1:{port[0]}"
            for args, wanted in ((["health", "--probe"], "READY"),
                                 (["generate", "The capital of France is", "--max-tokens", "8"], "finished: ")):
                run = subprocess.run([sys.executable, "-m", "openengine_adapters.cli", "--target", target, *args],
                                     capture_output=True, text=True, timeout=120, env=env)
                print(f"demo_check: openengine {' '.join(args)} -> exit {run.returncode}\n{run.stdout}{run.stderr}",
                      flush=True)
                if run.returncode != 0 or wanted not in run.stdout + run.stderr:
                    problems.append(f"openengine {args[0]} failed")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait(10)
        reader.join(10)
    if code != 0:
        problems.append(f"the launcher exited {code} after SIGTERM")
    text = "\n".join(lines)
    for bad in ("Traceback", "nanobind: leaked"):
        if bad in text:
            problems.append(f"{bad!r} in the launcher's output")
    if problems:
        print("\n".join(lines[-60:]), file=sys.stderr)
        print("demo_check FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("demo_check: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
