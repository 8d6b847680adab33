"""The Docker command line as the image tests use it: builds, containers, inspection, clean-up.

Everything goes through apt's client (``/usr/bin/docker``, or ``$OPENENGINE_DOCKER``): a newer client
earlier on PATH may want a buildx plugin that Debian does not package. BuildKit is on (the
Dockerfiles bind-mount their build context instead of copying it into a layer).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

DOCKER = os.environ.get("OPENENGINE_DOCKER", "/usr/bin/docker")
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "DOCKER_BUILDKIT": "1"}


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([DOCKER, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {shlex.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                             f"\n{proc.stderr[-5000:]}")
    return proc


def run_line(line: str, *extra: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run a documented ``docker build|run ...`` line, with CI's own options after the verb."""
    words = shlex.split(line)
    assert words[0] == "docker", line
    verb, rest = words[1], words[2:]
    started = time.monotonic()
    proc = docker(verb, *(["--progress=plain"] if verb == "build" else []), *extra, *rest, timeout=timeout)
    print(f"[{time.monotonic() - started:6.1f} s] {line}  (CI adds: {shlex.join(extra)})")
    return proc


def inspect(name: str) -> dict:
    return json.loads(docker("inspect", name).stdout)[0]


def image_mb(image: str) -> float:
    return inspect(image)["Size"] / 1e6


def health(container: str) -> str:
    state = inspect(container)["State"]
    if not state["Running"]:
        return f"exited {state['ExitCode']}"
    return state.get("Health", {}).get("Status", "none")


def wait_healthy(container: str, timeout: float = 600) -> float:
    """Seconds until Docker's own HEALTHCHECK reports healthy (the image's check, run by dockerd)."""
    started = time.monotonic()
    while (status := health(container)) != "healthy":
        if status.startswith("exited") or time.monotonic() - started > timeout:
            raise AssertionError(f"{container}: {status}; last output:\n{logs(container)}")
        time.sleep(1)
    return time.monotonic() - started


def logs(container: str, tail: int = 60) -> str:
    proc = docker("logs", "--tail", str(tail), container, check=False)
    return proc.stdout + proc.stderr


def wait_exit(container: str, timeout: float = 90) -> int:
    return int(docker("wait", container, timeout=timeout).stdout.strip())


def remove(containers: list[str], images: list[str]) -> None:
    """Best effort: everything a test made, containers first, newest image first."""
    for c in containers:
        docker("rm", "-f", "-v", c, check=False)
    for image in reversed(images):
        docker("rmi", "-f", image, check=False)
