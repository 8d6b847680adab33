"""Developer and CI sessions. `nox -s lint unit` is the test command CI runs (.ci/run)."""

import nox

nox.options.sessions = ["lint", "unit"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def unit(session: nox.Session) -> None:
    """The engine-free suite: contract, service, validation, streams, client (fake engine)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "openengine_adapters", "tests", "tools", "noxfile.py")


@nox.session
def proto(session: nox.Session) -> None:
    """Regenerate openengine_adapters/v1 from proto/ (the unit suite fails when they differ)."""
    session.install("grpcio-tools==1.85.1")
    session.run("python", "tools/gen_proto.py")
