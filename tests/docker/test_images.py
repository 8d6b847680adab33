"""The engine images (``docker/``), built and run with the documentation's lines (docs/running.md) (``nox -s docker``).

No registry is reachable here, so every build starts from a local Debian base made from the
Debian archive (``tools/docker_local_base.sh``). The CPU vLLM image, brought up by the aggregated
compose deployment users copy (``deploy/compose/aggregated.yaml``, Debian's docker-compose), passes
the conformance suite on both contract surfaces from the host and serves its metrics; run by
``docker run`` it drains on SIGTERM and exits 0, and serves in plugin mode.
Each GPU Dockerfile is built on a local stand-in for its engine's image: vLLM's on the CPU engine
base (that build IS the CPU image), TensorRT-LLM's on the tests' fake of its LLM API (served and
health-checked), SGLang's on its released package. Everything made is removed at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request

import grpc
import pytest
from docker_cli import ROOT, docker, image_mb, inspect, logs, remove, run_line, wait_exit, wait_healthy
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import free_port
from stream_contract import check_generate_stream

from openengine_adapters.v1 import generation_pb2 as g
from openengine_adapters.v1 import openengine_pb2_grpc

LOCAL_BASE = "local/debian:bookworm"
# The README's lines, run as written; CI adds options after the verb (a local base, a label).
WHEELS = "python -m pip download --no-deps -d docker/wheels torch==2.13.0+cpu"
VLLM_CPU_BASE = "docker build -f docker/vllm/cpu-base.Dockerfile -t openengine/vllm-cpu-base:0.32.0 docker/wheels"
VLLM_CPU = ("docker build -f docker/vllm/Dockerfile --build-arg BASE_IMAGE=openengine/vllm-cpu-base:0.32.0 "
            "-t openengine/vllm-cpu .")
VLLM_RUN = "docker run -p 50051:50051 openengine/vllm-cpu"
SGLANG = "docker build -f docker/sglang/Dockerfile -t openengine/sglang ."
TRTLLM = "docker build -f docker/trtllm/Dockerfile -t openengine/trtllm ."
README_LINES = (WHEELS, VLLM_CPU_BASE, VLLM_CPU, VLLM_RUN, SGLANG, TRTLLM)
# CI's stand-ins for the engine images that cannot be pulled here (test-only bases)
TRTLLM_STANDIN = ("docker build -f tests/docker/standins/trtllm.Dockerfile -t openengine-ci/trtllm-standin "
                  "tests/trtllm")
SGLANG_STANDIN = ("docker build -f tests/docker/standins/sglang.Dockerfile -t openengine-ci/sglang-standin "
                  "tests/docker/standins")
ADMIN_KEY = secrets.token_hex(16)
COMPOSE_FILE = "deploy/compose/aggregated.yaml"
DOCKER_COMPOSE = os.environ.get("OPENENGINE_DOCKER_COMPOSE", "/usr/bin/docker-compose")  # Debian's docker-compose
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"  # an empty tar
DEMO_IN_IMAGE = "/home/openengine/.cache/openengine-adapters/demo-llama"


@pytest.fixture(scope="session")
def made():
    """What the tests made (containers, images), removed at the end whatever happened."""
    record: dict[str, list[str]] = {"containers": [], "images": []}
    yield record
    remove(record["containers"], record["images"])


@pytest.fixture(scope="session")
def local_base(made):
    started = time.monotonic()
    made["images"].append(LOCAL_BASE)
    subprocess.run(["bash", "tools/docker_local_base.sh", LOCAL_BASE], cwd=ROOT, check=True, timeout=900)
    print(f"[{time.monotonic() - started:6.1f} s] bash tools/docker_local_base.sh {LOCAL_BASE}")
    return LOCAL_BASE


def build(made, line: str, *extra: str) -> str:
    words = shlex.split(line)
    tag = words[words.index("-t") + 1]
    made["images"].append(tag)
    run_line(line, *extra)
    return tag


def revision() -> list[str]:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return ["--build-arg", f"REVISION={rev}"] if rev else []


def start(made, image: str, *args: str, ports=(50051,), options=()) -> tuple[str, dict[int, int]]:
    """``docker run -d`` with each container port published on a free loopback port."""
    name = f"openengine-ci-{image.split('/')[-1].replace(':', '-')}-{len(made['containers'])}"
    mapped = {p: free_port() for p in ports}
    made["containers"].append(name)
    publish = [arg for p, host in mapped.items() for arg in ("-p", f"127.0.0.1:{host}:{p}")]
    docker("rm", "-f", "-v", name, check=False)  # one an interrupted earlier run left behind
    docker("run", "-d", "--name", name, *publish, *options, image, *args)
    return name, mapped


def grpc_health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def generate(target: str, max_tokens: int):
    request = g.GenerateRequest(prompt="Hello", stopping=g.StoppingOptions(max_tokens=max_tokens, ignore_eos=True))
    channel = grpc.insecure_channel(target)
    return request, channel, openengine_pb2_grpc.OpenEngineStub(channel).Generate(request, timeout=120)


def check_layout(image: str, base: str, engine: str) -> None:
    """What every engine image promises, read from the image itself."""
    info, config = inspect(image), inspect(image)["Config"]
    assert config["User"] == "10001"
    assert config["Entrypoint"] == ["openengine-entrypoint"] and not config["Cmd"]
    assert "50051/tcp" in config["ExposedPorts"]
    assert config["Healthcheck"]["Test"] == ["CMD", "openengine-healthcheck"]
    assert f"OPENENGINE_ENGINE={engine}" in config["Env"] and "HOME=/home/openengine" in config["Env"]
    labels = config["Labels"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"] == base
    assert labels["io.openengine.engine"] == engine
    assert labels["io.openengine.schema.revision"] == "1"
    code = ("from openengine_adapters import schema as s; "
            "print(s.SCHEMA_REVISION, s.SCHEMA_RELEASE, getattr(s, 'V0_1_SCHEMA_RELEASE', ''))")
    declared = docker("run", "--rm", "--entrypoint", "python3", image, "-c", code).stdout.split()
    assert declared[0] == "1"
    assert set(labels["io.openengine.schema.releases"].split()) == set(declared[1:]), "label and package disagree"
    # one layer of ours over the engine's (WORKDIR adds an empty one), holding no build tools
    ours = [layer for layer in info["RootFS"]["Layers"][len(inspect(base)["RootFS"]["Layers"]):]
            if layer != EMPTY_LAYER]
    assert len(ours) == 1, ours
    added = image_mb(image) - image_mb(base)
    new = sorted(distributions(image) - distributions(base))
    print(f"{image}: {image_mb(image):.0f} MB, our layer {added:.1f} MB over {base}, adding {new}")
    assert "openengine-adapters" in new and not {"setuptools", "wheel", "build", "pip"} & set(new), new
    assert added < 60, f"our layer is {added:.1f} MB"


def distributions(image: str) -> set[str]:
    code = "import importlib.metadata as m; print(*{d.metadata['Name'].lower() for d in m.distributions()})"
    return set(docker("run", "--rm", "--user", "0", "--entrypoint", "python3", image, "-c", code).stdout.split())


def test_readme_shows_the_lines_ci_runs():
    page = (ROOT / "docs" / "running.md").read_text()
    missing = [line for line in README_LINES if line not in page]
    assert not missing, f"docs/running.md's Docker section lacks: {missing}"


@pytest.fixture(scope="session")
def vllm_cpu(made, local_base):
    started = time.monotonic()
    subprocess.run([sys.executable, *shlex.split(WHEELS)[1:], "-q"], cwd=ROOT, check=True, timeout=600)
    print(f"[{time.monotonic() - started:6.1f} s] {WHEELS}")
    base = build(made, VLLM_CPU_BASE, "--build-arg", f"PYTHON_IMAGE={local_base}")
    return build(made, VLLM_CPU, *revision()), base


@pytest.fixture(scope="session")
def vllm_container(made, vllm_cpu):
    """``docker run -p 50051:50051 openengine/vllm-cpu``: the demo model, no engine flags."""
    assert shlex.split(VLLM_RUN)[-1] == vllm_cpu[0]
    # The host is not loopback to the container: its operator RPCs (Drain, LoadLora, Abort all) need
    # an admin key, passed like any sidecar flag after the image name.
    name, ports = start(made, vllm_cpu[0], "--admin-api-key", ADMIN_KEY)
    print(f"[{wait_healthy(name):6.1f} s] {VLLM_RUN} --admin-api-key KEY: healthy (Docker's HEALTHCHECK)")
    return name, f"127.0.0.1:{ports[50051]}"


def test_vllm_cpu_image_layout(vllm_cpu):
    check_layout(*vllm_cpu, "vllm")


def test_compose_deployment_on_the_cpu_image_passes_conformance_from_the_host(vllm_cpu, tmp_path):
    """deploy/compose/aggregated.yaml as written; CI sets only its variables (image, key files, host
    ports). Up before the ``docker run`` container starts (one engine at a time), down at the end."""
    keys = tmp_path / "secrets"
    keys.mkdir()
    (keys / "api-keys").write_text(secrets.token_hex(16) + "\n")
    (keys / "admin-keys").write_text(ADMIN_KEY + "\n")  # the conformance suite's token: valid on every RPC
    ports = free_port(), free_port()
    env = {**os.environ, "OPENENGINE_IMAGE": vllm_cpu[0], "OPENENGINE_SECRETS_DIR": str(keys),
           "GRPC_PORT": str(ports[0]), "METRICS_PORT": str(ports[1])}
    project = ["-p", "openengine-ci-compose", "-f", str(ROOT / COMPOSE_FILE)]
    started = time.monotonic()
    try:
        compose(*project, "up", "-d", env=env)
        name = compose(*project, "ps", "-q", "vllm", env=env).stdout.strip()
        print(f"[{wait_healthy(name):6.1f} s] {DOCKER_COMPOSE} up -d {COMPOSE_FILE}: healthy")
        target = f"127.0.0.1:{ports[0]}"
        assert grpc_health(target) == health_pb2.HealthCheckResponse.SERVING
        report = tmp_path / "conformance.json"
        proc = subprocess.run([sys.executable, "-m", "conformance", "--target", target, "--contract", "both",
                               "--token", ADMIN_KEY, "--timeout", "120", "--json", str(report)],
                              cwd=ROOT, capture_output=True, text=True, timeout=1200)
        print(proc.stdout, proc.stderr[-3000:], f"[{time.monotonic() - started:6.1f} s] conformance", sep="\n")
        assert proc.returncode == 0, f"conformance failed against the compose deployment:\n{logs(name)}"
        summaries = list(_summaries(json.loads(report.read_text())))
        print("conformance summaries:", summaries)
        passed = sum(s["passed"] for s in summaries)
        assert passed >= 100, f"only {passed} checks passed on the two surfaces"
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert "vllm:" in metrics and "openengine_requests_total" in metrics, "the compose file's metrics port"
    finally:
        compose(*project, "down", "-v", "--remove-orphans", "-t", "60", env=env, check=False)


def compose(*args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([DOCKER_COMPOSE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker-compose {shlex.join(args)} exited {proc.returncode}:\n{proc.stderr[-5000:]}")
    return proc


def _summaries(node):
    if isinstance(node, dict):
        if isinstance(node.get("summary"), dict) and "passed" in node["summary"]:
            yield node["summary"]
        for value in node.values():
            yield from _summaries(value)
    elif isinstance(node, list):
        for value in node:
            yield from _summaries(value)


def test_vllm_cpu_container_drains_on_sigterm_and_exits_0(vllm_container):
    name, target = vllm_container
    request, channel, call = generate(target, 300)
    with channel:
        first = next(call)
        docker("kill", "--signal", "TERM", name)
        responses = [first, *call]
    summary = check_generate_stream(request, responses)
    assert summary.finished[0].reason == g.FINISH_REASON_LENGTH, "the stream in flight was not drained"
    assert len(summary.token_ids[0]) == 300
    assert wait_exit(name) == 0, logs(name)


def test_vllm_plugin_mode_is_one_variable_away(made, vllm_cpu, vllm_container, tmp_path):
    """OPENENGINE_MODE=plugin: `vllm serve` with its own flags, OpenAI HTTP and OpenEngine gRPC on one engine."""
    model = tmp_path / "demo-llama"
    docker("cp", f"{vllm_container[0]}:{DEMO_IN_IMAGE}", str(model))  # the model the sidecar built
    # float32: `vllm serve` on this CPU loses its worker on the first bfloat16 step (the sidecar does not)
    name, ports = start(made, vllm_cpu[0], "--model", "/models/demo-llama", "--served-model-name", "demo-llama",
                        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--shutdown-timeout", "30",
                        ports=(50051, 8000),
                        options=("-e", "OPENENGINE_MODE=plugin", "-v", f"{model}:/models/demo-llama:ro"))
    print(f"[{wait_healthy(name):6.1f} s] plugin mode: healthy")
    completion = http_completion(ports[8000])
    assert completion["choices"][0]["finish_reason"] == "length", completion
    request, channel, call = generate(f"127.0.0.1:{ports[50051]}", 5)
    with channel:
        summary = check_generate_stream(request, list(call))
    assert len(summary.token_ids[0]) == 5
    docker("kill", "--signal", "TERM", name)
    assert wait_exit(name) == 0, logs(name)


def http_completion(port: int) -> dict:
    body = json.dumps({"model": "demo-llama", "prompt": "Hello", "max_tokens": 3}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"content-type": "application/json"})
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"no HTTP answer: {exc}") from exc
            time.sleep(0.5)


def test_trtllm_dockerfile_on_its_stand_in_serves(made, local_base):
    standin = build(made, TRTLLM_STANDIN, "--build-arg", f"PYTHON_IMAGE={local_base}")
    image = build(made, TRTLLM, "--build-arg", f"BASE_IMAGE={standin}", *revision())
    check_layout(image, standin, "trtllm")
    assert "python -m openengine_adapters.trtllm" in docker("run", "--rm", image, "--help").stdout
    refused = docker("run", "--rm", "-e", "OPENENGINE_MODE=plugin", image, check=False)
    assert refused.returncode == 2 and "no plugin mode" in refused.stderr
    name, ports = start(made, image, "fake-model", "--served_model_name", "fake")
    print(f"[{wait_healthy(name):6.1f} s] trtllm on its stand-in: healthy")
    request, channel, call = generate(f"127.0.0.1:{ports[50051]}", 5)
    with channel:
        summary = check_generate_stream(request, list(call))
    assert len(summary.token_ids[0]) == 5
    docker("kill", "--signal", "TERM", name)
    assert wait_exit(name) == 0, logs(name)


def test_sglang_dockerfile_on_its_stand_in_builds(made, local_base):
    standin = build(made, SGLANG_STANDIN, "--build-arg", f"PYTHON_IMAGE={local_base}")
    image = build(made, SGLANG, "--build-arg", f"BASE_IMAGE={standin}", *revision())
    check_layout(image, standin, "sglang")
    plugins = docker("run", "--rm", "--entrypoint", "python3", image, "-c",
                     "import importlib.metadata as m; print(*(e.value for e in m.entry_points("
                     "group='sglang.srt.plugins')))").stdout.split()
    assert plugins == ["openengine_adapters.sglang.plugin:register"]
    # nothing serves in this container: the health check must say so (it can fail)
    check = docker("run", "--rm", "--entrypoint", "openengine-healthcheck", image, check=False)
    assert check.returncode == 1 and "127.0.0.1:50051: UNAVAILABLE" in check.stderr, check
