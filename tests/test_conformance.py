"""The conformance suite against the fake engine: as a CLI on fresh server processes, as a pytest plugin,
role-aware on PREFILL/DECODE fakes, and against deliberately broken servers (it must catch them)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_backend import FakeBackend, default_card

from conformance import run_suite_async
from conformance.checks import all_checks
from openengine_adapters.server import OpenEngineServer
from openengine_adapters.server_config import ServerConfig
from openengine_adapters.types import EngineRole, GuidedMode

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SLOW = ["--long-request-metadata", "fake.step_delay_ms=20"]
ADMISSION_LIMIT = 4

CHECKS = all_checks()


def _start_fake(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "serve_fake.py"), "--host", "127.0.0.1",
                             "--port", "0", "--drain-grace-s", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, text=True)
    while not (m := re.search(r"ready on .*:(\d+)", line := proc.stdout.readline())):
        assert line, "fake server did not start"
    return proc, f"127.0.0.1:{m.group(1)}"


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
    proc.stdout.close()


def _cli(tmp_path_factory, *args: str) -> tuple[int, dict, str]:
    """A fresh fake server process, then ``python -m conformance`` against it; (exit code, JSON report, table)."""
    out = tmp_path_factory.mktemp("conformance") / "report.json"
    proc, target = _start_fake("--max-in-flight", str(ADMISSION_LIMIT))
    try:
        run = subprocess.run([sys.executable, "-m", "conformance", "--target", target, "--json", str(out), *SLOW,
                              *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    finally:
        _stop(proc)
    assert out.exists(), run.stdout + run.stderr
    return run.returncode, json.loads(out.read_text()), run.stdout


def _lora_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("lora")
    (path / "adapter_config.json").write_text("{}\n")  # what the fake loads as an adapter
    return str(path)


# every opt-in engine hook the fake offers (fake_backend's docstring)
def _hooks(tmp_path_factory) -> list[str]:
    return ["--expect-admission-limit", str(ADMISSION_LIMIT), "--fail-request-metadata", "fake.crash_after=2",
            "--serial-request-metadata", "fake.serialize=1", "--lora-dir", _lora_dir(tmp_path_factory)]


OPT_IN = ("lifecycle.admission_limit", "generate.failure_after_acceptance", "generate.priority_order",
          "lora.lifecycle")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return _cli(tmp_path_factory, *_hooks(tmp_path_factory))


@pytest.fixture(scope="module")
def destructive_run(tmp_path_factory):
    return _cli(tmp_path_factory, "--destructive", "--only", "lifecycle,identity")


def _results(run) -> dict[str, dict]:
    return {r["name"]: r for r in run[1]["results"]}


@pytest.mark.parametrize("name", [c.name for c in CHECKS if not c.destructive])
def test_check_on_fake(full_run, name):
    r = _results(full_run)[name]
    assert r["status"] in ("pass", "skip"), f"{name}: {r['reason']}"


@pytest.mark.parametrize("name", [c.name for c in CHECKS if c.destructive])
def test_destructive_check_on_fresh_fake(destructive_run, name):
    r = _results(destructive_run)[name]
    assert r["status"] == "pass", f"{name}: {r['status']} {r['reason']}"


def test_full_run_summary(full_run):
    code, report, table = full_run
    failed = {r["name"] for r in report["results"] if r["status"] == "fail"}
    assert not failed, f"unexpected failures: {failed}"
    assert code == 0
    assert report["summary"]["passed"] >= 75, report["summary"]
    assert report["summary"]["total"] == len(CHECKS)
    skipped = {r["name"]: r["reason"] for r in report["results"] if r["status"] == "skip"}
    assert skipped["lifecycle.drain"].startswith("destructive")
    for name in OPT_IN:
        assert _results(full_run)[name]["status"] == "pass", _results(full_run)[name]
    assert re.search(r"generate\.stop_text\s+PASS", table)
    assert "skipped: role AGGREGATED is not PREFILL" in table


def test_destructive_run_summary(destructive_run):
    code, report, _ = destructive_run
    assert code == 0, [r for r in report["results"] if r["status"] == "fail"]
    assert all(r["status"] != "skip" or "destructive" not in r["reason"] for r in report["results"])


def test_pytest_plugin_turns_checks_into_items(tmp_path):
    proc, target = _start_fake()
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-p", "conformance.pytest_plugin", "-p",
                              "no:cacheprovider", "-q", "-rs", "--rootdir", str(tmp_path), "--conformance-target",
                              target, "--conformance-only", "identity,model_info,lora"],
                             capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=60)
    finally:
        _stop(proc)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"1[0-9] passed, 2 skipped", run.stdout), run.stdout


@pytest.mark.parametrize("role", [EngineRole.PREFILL, EngineRole.DECODE])
async def test_role_aware_on_disaggregated_fakes(serve, role):
    async with serve(role=role) as h:
        report = await run_suite_async(h.target, check_timeout_s=20)
    failed = {r.name: r.reason for r in report.failures()}
    assert not failed, failed
    assert report.get("generate.stop_text").status == "skip"
    wanted = (["generate.prefill_ready", "generate.prefill_card_matches_role"] if role == EngineRole.PREFILL
              else ["generate.decode_requires_session"])
    for want in wanted:
        assert report.get(want).status == "pass", report.get(want)


# deliberately broken servers ------------------------------------------------------------------------------

class IgnoresRegex(FakeBackend):
    """Advertises REGEX guided decoding but ignores the pattern (emits "{}")."""

    def __init__(self):
        card = default_card()
        gen = dataclasses.replace(card.generation, guided_decoding=dataclasses.replace(
            card.generation.guided_decoding, modes=(GuidedMode.CHOICE, GuidedMode.JSON_OBJECT, GuidedMode.REGEX)))
        super().__init__(cards=[dataclasses.replace(card, generation=gen)])


class IgnoresStopText(FakeBackend):
    """Accepts stop strings and never stops on them."""

    async def generate(self, params):
        return await super().generate(dataclasses.replace(
            params, stopping=dataclasses.replace(params.stopping, stop_texts=())))


@pytest.mark.parametrize(("backend", "only", "broken"), [
    (IgnoresRegex, "guided", "guided.regex"),
    (IgnoresStopText, "generate.stop,generate.include", "generate.stop_text"),
])
async def test_suite_catches_a_broken_server(tmp_path, backend, only, broken):
    server = await OpenEngineServer(backend(), ServerConfig(host="127.0.0.1", port=0, advertise_host="127.0.0.1",
                                                            drain_grace_s=0.5)).start()
    try:
        out = tmp_path / "report.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conformance", "--target", f"127.0.0.1:{server.port}", "--only", only,
            "--json", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=ENV, cwd=ROOT)
        stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await server.stop(0.5)
    assert proc.returncode == 1, stdout.decode()
    report = json.loads(out.read_text())
    results = {r["name"]: r for r in report["results"]}
    assert results[broken]["status"] == "fail", results[broken]
    assert not report["summary"]["ok"]
    assert re.search(rf"{re.escape(broken)}\s+FAIL", stdout.decode())


# the v0.1.0 contract -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", [EngineRole.AGGREGATED, EngineRole.PREFILL, EngineRole.DECODE])
async def test_v0_1_contract_passes_on_every_role(serve, role):
    async with serve(role=role) as h:
        report = await run_suite_async(h.target, check_timeout_s=20, contract="v0.1.0",
                                       long_metadata={"fake.step_delay_ms": "20"})
    failed = {r.name: r.reason for r in report.failures()}
    assert not failed, failed
    assert report.engine["contract"] == "v0.1.0"
    reasons = {r.name: r.reason for r in report.results if r.status == "skip"}
    assert "not part of the v0.1.0 contract" in reasons["tasks.embed_basic"], reasons.get("tasks.embed_basic")
    if role == EngineRole.AGGREGATED:
        for name in ("v0_1.server_info", "v0_1.metadata.malformed_priority", "v0_1.metadata.repeated_key",
                     "v0_1.metadata.dp_rank_out_of_range", "v0_1.metadata.priority_as_advertised",
                     "v0_1.extra.unknown_keys_ignored", "generate.stream_contract", "lifecycle.abort_running"):
            assert report.get(name).status == "pass", report.get(name)


def test_cli_contract_both_runs_each_surface(tmp_path_factory):
    code, report, table = _cli(tmp_path_factory, "--contract", "both", "--destructive", *_hooks(tmp_path_factory))
    assert code == 0, table
    assert [r["engine"]["contract"] for r in report["reports"]] == ["v0.1.0", "revision-1"]
    for r in report["reports"]:
        assert not [x for x in r["results"] if x["status"] == "fail"], r["engine"]
    v01 = {x["name"]: x for x in report["reports"][0]["results"]}
    assert v01["lifecycle.drain"]["status"] == "skip" and "v0.1.0" in v01["lifecycle.drain"]["reason"]
    assert v01["lifecycle.abort_all_requests"]["status"] == "pass"
    for name in (*OPT_IN, "v0_1.error_event", "v0_1.admission_limit"):  # every opt-in hook, on v0.1.0 too
        assert v01[name]["status"] == "pass", v01[name]


async def test_v0_1_checks_catch_a_server_without_the_metadata_rules(monkeypatch):
    from openengine_adapters.wire.v0_1 import metadata as md

    monkeypatch.setattr(md, "RESERVED_PREFIX", "never-reserved-")  # the one-value rule no longer applies
    server = await OpenEngineServer(FakeBackend(), ServerConfig(host="127.0.0.1", port=0, advertise_host="127.0.0.1",
                                                                drain_grace_s=0.5)).start()
    try:
        report = await run_suite_async(f"127.0.0.1:{server.port}", only="v0_1", contract="v0.1.0",
                                       check_timeout_s=20)
    finally:
        await server.stop(0.5)
    assert report.get("v0_1.metadata.repeated_key").status == "fail"
    assert report.get("v0_1.metadata.malformed_priority").status == "fail"


def test_plain_run_says_what_it_skips_and_which_flag_runs_it(tmp_path_factory):
    code, report, table = _cli(tmp_path_factory, "--only", ",".join(OPT_IN))
    assert code == 0, table
    groups = report["skipped_by_enabler"]
    flags = {"lifecycle.admission_limit": "--expect-admission-limit",
             "generate.failure_after_acceptance": "--fail-request-metadata",
             "generate.priority_order": "--serial-request-metadata", "lora.lifecycle": "--lora-dir"}
    for name, flag in flags.items():
        assert any(name in names and how.startswith(flag) for how, names in groups.items()), (name, groups)
    assert "Skipped checks, by what would run them:" in table and "--lora-dir" in table


@pytest.mark.parametrize("contract", ["revision-1", "v0.1.0"])
async def test_task_only_model(serve, contract):
    """An embedding/classifier/scorer model on an engine that cannot generate: the task checks run, every
    generation check skips for that reason, and Generate's refusal is checked (no extra flag needed)."""
    from fake_backend import ALL_FEATURES

    from openengine_adapters.types import Feature

    async with serve(cards=[default_card(generation=None)], features=ALL_FEATURES - {Feature.GENERATE}) as h:
        report = await run_suite_async(h.target, check_timeout_s=20, contract=contract)
    assert not report.failures(), {r.name: r.reason for r in report.failures()}
    assert report.get("generate.refused_on_task_only_model").status == "pass"
    if contract == "revision-1":
        assert report.get("tasks.embed_basic").status == "pass"
    assert "no generation capabilities" in report.get("generate.stream_contract").reason
