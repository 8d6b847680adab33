"""The mutation smoke subset: a few single-violation mutants of our own server (tests/mutants/catalog.py),
each served in its own process, must each be killed by the conformance check named for it. The full set
runs with ``nox -s mutation`` (score and survivors printed; not part of the per-commit run)."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "mutants"))

import run as mutation  # noqa: E402
from catalog import MUTANTS  # noqa: E402

from conformance.checks import all_checks  # noqa: E402

CHECK_NAMES = [c.name for c in all_checks()]


def test_catalog_is_well_formed():
    assert len(MUTANTS) >= 80
    for m in MUTANTS.values():
        assert m.rule and m.target in ("aggregated", "prefill", "decode", "task-only"), m
        if m.smoke:
            for glob in m.smoke.split(","):
                assert any(fnmatch.fnmatchcase(n, glob) for n in CHECK_NAMES), f"{m.name}: no check {glob}"
    smoke = [m for m in MUTANTS.values() if m.smoke]
    assert len(smoke) >= 10
    assert {m.domain for m in smoke} >= {"stream", "validate", "lifecycle", "drain", "lora", "kv", "v0_1"}


def test_smoke_mutants_are_killed():
    mutants = [m for m in MUTANTS.values() if m.smoke]
    result = mutation.run_mutants(mutants, jobs=2, smoke=True, progress=None)
    assert not result["errors"], result["errors"]
    survivors = [s["name"] for s in result["survivors"]]
    assert not survivors, f"mutants the suite no longer kills: {survivors}"
    for r in result["results"]:  # killed by the check named for it, not by accident
        assert any(fnmatch.fnmatchcase(f.split(":", 1)[1], MUTANTS[r["name"]].smoke) for f in r["failed_checks"]), r


def test_a_mutant_only_a_hook_reveals_is_expected_to_survive_only_without_hooks():
    failing = MUTANTS["stream.engine_failure_after_tokens_silent"]
    assert failing.needs == "--fail-request-metadata"
    assert mutation.expected_survival(failing, hooks=True) == ""
    assert "--fail-request-metadata" in mutation.expected_survival(failing, hooks=False)
    assert mutation.expected_survival(MUTANTS["stream.second_finish"], hooks=False) == ""
    assert "--fail-request-metadata" not in mutation.suite_flags("/tmp/lora", hooks=False)
    assert "--fail-request-metadata" in mutation.suite_flags("/tmp/lora", hooks=True)
