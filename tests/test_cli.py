"""``openengine``, the command-line client, run as a process against the fake engine's server process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "serve_fake.py"), "--host", "127.0.0.1",
                             "--port", "0", "--drain-grace-s", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=ENV, text=True)
    line = proc.stdout.readline()
    m = re.search(r"ready on .*:(\d+)", line)
    assert m, line
    yield f"127.0.0.1:{m.group(1)}"
    proc.terminate()
    proc.wait(15)


def cli(*args: str, target: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "openengine_adapters.cli", *(("--target", target) if target else ()), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=timeout)


@pytest.mark.parametrize("contract", ["revision-1", "v0.1.0"])
def test_info_models_health_load(server, contract):
    info = json.loads(cli("--contract", contract, "info", target=server).stdout)
    assert info["engine_name"] == "fake" and info["schema_revision"] == 1
    assert ("capacity" in info) == (contract == "v0.1.0")
    models = [json.loads(line) for line in cli("--contract", contract, "models", target=server).stdout.splitlines()]
    assert [m["served_model_name"] for m in models] == ["tiny"]
    health = cli("--contract", contract, "health", "--probe", target=server)
    assert health.returncode == 0 and health.stdout.splitlines()[0] == "READY", health  # as the contract spells it
    assert "inference_probe: READY" in health.stdout
    load = json.loads(cli("--contract", contract, "load", target=server).stdout)
    assert load["running_requests"] == 0


@pytest.mark.parametrize("contract", ["revision-1", "v0.1.0"])
def test_generate_streams_text_and_json_events(server, contract):
    run = cli("--contract", contract, "generate", "hello", "--max-tokens", "5", target=server)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.strip()) == 5, run.stdout  # stdout is the text alone
    assert run.stderr.splitlines() == ["finished: LENGTH", "usage: 5 prompt + 5 completion tokens"], run.stderr
    events = [json.loads(line) for line in
              cli("--contract", contract, "generate", "hello", "--max-tokens", "3", "--json", target=server)
              .stdout.splitlines()]
    kinds = [next(k for k in e if k != "request_id") for e in events]
    assert kinds[-1] == "finished" and set(kinds[:-1]) == {"token"}
    assert sum(len(e["token"]["tokens"]) for e in events[:-1]) == 3  # however the server grouped them
    several = cli("--contract", contract, "generate", "hi", "--max-tokens", "2", "-n", "2", "--seed", "3",
                  target=server)
    assert {line[:3] for line in several.stdout.splitlines() if line} == {"[0]", "[1]"}


def test_generate_ends_with_the_stop_that_ended_it(server):
    run = cli("generate", "hello", "--max-tokens", "20", "--stop", "l", target=server)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines()[0] == "finished: STOP (stop_text 'l')", run.stderr


def test_unknown_model_is_exit_5_in_one_line(server):
    run = cli("generate", "hi", "--model", "nope", target=server)
    assert run.returncode == 5, run
    assert run.stderr.count("\n") == 1 and run.stderr.startswith(f"openengine: {server}: NOT_FOUND: ")
    assert "nope" in run.stderr and "Traceback" not in run.stderr


def test_generate_engine_failure_is_exit_1(server):
    run = cli("generate", "hi", "--max-tokens", "2", "--temperature", "-1", target=server)
    assert run.returncode == 1 and "INVALID_ARGUMENT" in run.stderr and "temperature" in run.stderr


def test_abort(server):
    unknown = cli("abort", "never-sent", target=server)
    assert unknown.returncode == 5 and "NOT_FOUND" in unknown.stderr
    everything = cli("abort", "--all", target=server)  # loopback: an operator action is allowed
    assert everything.returncode == 0 and everything.stdout.startswith("aborted"), everything


def test_event_tails_and_a_closed_pipe(server):
    proc = subprocess.Popen([sys.executable, "-m", "openengine_adapters.cli", "--target", server, "kv-events",
                             "--snapshot"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
    try:
        first = json.loads(proc.stdout.readline())
        assert "all_blocks_cleared" in first["batch"]["events"][0]
    finally:
        proc.terminate()
        proc.wait(10)
    # `openengine generate --json ... | head -1`: the reader leaves; the client exits without a traceback
    shell = subprocess.run(f"{sys.executable} -m openengine_adapters.cli --target {server} generate hi --json"
                           " --max-tokens 50 | head -1", shell=True, capture_output=True, text=True, env=ENV,
                           timeout=30)
    assert '"token"' in shell.stdout and "Traceback" not in shell.stderr, shell.stderr


def test_unreachable_target_is_exit_3_in_one_line():
    started = time.monotonic()
    target = f"127.0.0.1:{free_port()}"
    run = cli("--timeout", "2", "info", target=target)
    assert run.returncode == 3 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"openengine: cannot reach {target}: is the server running there"), run.stderr
    assert time.monotonic() - started < 20


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """A TLS server with a client key and an admin key."""
    from pki import make_ca

    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "ca")
    leaf = ca.issue(d, "server", hosts=("127.0.0.1", "localhost"))
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "serve_fake.py"), "--host", "127.0.0.1",
                             "--port", "0", "--tls-cert-file", leaf.cert, "--tls-key-file", leaf.key,
                             "--api-key", "k1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV, text=True)
    line = proc.stdout.readline()
    m = re.search(r"ready on .*:(\d+)", line)
    assert m, line
    yield f"127.0.0.1:{m.group(1)}", ca.cert, make_ca(d, "other").cert
    proc.terminate()
    proc.wait(15)


def test_tls_mismatches_and_refused_tokens_are_one_line_each(tls_server, server):
    target, ca, other = tls_server
    ok = cli("--tls-ca-file", ca, "--token", "k1", "health", target=target)
    assert ok.returncode == 0 and ok.stdout.startswith("READY"), ok
    for args, where, status in (
            (("--token", "k1"), target, 3),  # plaintext to a TLS server
            (("--tls-ca-file", other, "--token", "k1"), target, 3),  # a CA that did not sign it
            (("--tls-ca-file", ca), server, 3),  # TLS to a plaintext server
            (("--tls-ca-file", ca, "--token", "wrong"), target, 4),
            (("--tls-ca-file", ca), target, 4)):  # no token
        run = cli("--timeout", "5", *args, "info", target=where)
        assert run.returncode == status, (args, run)
        assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, (args, run.stderr)
        if status == 3:
            assert run.stderr.startswith(f"openengine: cannot reach {where}: "), run.stderr
        else:
            assert "UNAUTHENTICATED" in run.stderr and "--token" in run.stderr, run.stderr


def test_version_and_help_read_as_plain_text():
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("openengine "), version
    assert "schema_release" in version.stdout
    helptext = cli("--help")
    assert helptext.returncode == 0 and "``" not in helptext.stdout and "exit status: 0 success" in helptext.stdout


def test_json_is_indented_on_a_terminal_and_compact_when_piped(server):
    """A terminal (a pty) gets indented JSON; a pipe and --json one object a line."""
    import pty

    piped = cli("info", target=server).stdout
    assert len(piped.strip().splitlines()) == 1 and json.loads(piped)["engine_name"] == "fake"
    argv = [sys.executable, "-m", "openengine_adapters.cli", "--target", server]
    for extra, lines in (((), "many"), (("--json",), "one")):
        output = bytearray()

        def read(fd, output=output):
            data = os.read(fd, 65536)
            output.extend(data)
            return data
        old = dict(os.environ)
        os.environ["PYTHONPATH"] = ENV["PYTHONPATH"]
        try:
            status = pty.spawn([*argv, *extra, "info"], read)
        finally:
            os.environ.clear()
            os.environ.update(old)
        text = output.decode().replace("\r\n", "\n").strip()
        assert os.waitstatus_to_exitcode(status) == 0, text
        assert json.loads(text)["engine_name"] == "fake"
        assert (len(text.splitlines()) > 5) == (lines == "many"), text


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'openengine = "openengine_adapters.cli:main"' in text


def test_the_readme_python_example_runs(server, tmp_path):
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- python-example:begin -->")[1].split("<!-- python-example:end -->")[0]
    code = block.split("```python\n", 1)[1].rsplit("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(code.replace('target="localhost:50051"', f'target="{server}"'))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=ENV, timeout=60)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.strip()) == 16  # the fake engine: one character per token
