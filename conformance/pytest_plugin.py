"""pytest plugin: each conformance check becomes a test item.

    pytest -p conformance.pytest_plugin --conformance-target HOST:PORT [--conformance-model NAME]
           [--conformance-destructive] [--conformance-only PATTERN] [--conformance-admission-limit N]
           [--conformance-long-metadata KEY=VALUE] [--conformance-fail-metadata KEY=VALUE]
           [--conformance-serial-metadata KEY=VALUE] [--conformance-lora-dir DIR]

Items run in the suite's order against one shared connection (a private event loop); a check that
skips is a skipped test with the suite's reason, a failing check fails with the violation.
"""

from __future__ import annotations

import asyncio

import pytest

from conformance.checks import all_checks
from conformance.context import Options
from conformance.registry import Check
from conformance.report import FAIL, SKIP
from conformance.runner import Suite, select


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "OpenEngine conformance suite")
    group.addoption("--conformance-target", default=None, help="HOST:PORT of the OpenEngine server to check")
    group.addoption("--conformance-model", default=None, help="model to check (default: the first supported)")
    group.addoption("--conformance-destructive", action="store_true", help="also run state-changing checks")
    group.addoption("--conformance-only", default=None, help="comma-separated globs/substrings of check names")
    group.addoption("--conformance-admission-limit", type=int, default=None,
                    help="the target admits N concurrent requests (N+1 must be RESOURCE_EXHAUSTED)")
    group.addoption("--conformance-long-metadata", action="append", default=[],
                    help="KEY=VALUE metadata for requests that must stay running")
    group.addoption("--conformance-fail-metadata", action="append", default=[],
                    help="KEY=VALUE metadata that makes the engine fail an accepted request (opt-in hook)")
    group.addoption("--conformance-serial-metadata", action="append", default=[],
                    help="KEY=VALUE metadata that makes the engine queue requests by priority (opt-in hook)")
    group.addoption("--conformance-lora-dir", default=None, help="a directory the target loads as a LoRA adapter")
    group.addoption("--conformance-timeout", type=float, default=60.0, help="per-call timeout in seconds")


class _Session:
    """One Suite on a private loop, opened lazily by the first item and closed at session end."""

    def __init__(self, config) -> None:
        def meta(name: str) -> dict[str, str]:
            return dict(item.split("=", 1) for item in config.getoption(name))

        self.options = Options(destructive=config.getoption("conformance_destructive"),
                               expect_admission_limit=config.getoption("conformance_admission_limit"),
                               long_metadata=meta("conformance_long_metadata"),
                               fail_metadata=meta("conformance_fail_metadata"),
                               serial_metadata=meta("conformance_serial_metadata"),
                               lora_dir=config.getoption("conformance_lora_dir"),
                               check_timeout_s=config.getoption("conformance_timeout"))
        self.target = config.getoption("conformance_target")
        self.model = config.getoption("conformance_model")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.suite: Suite | None = None

    def run(self, c: Check):
        if self.suite is None:
            self.loop = asyncio.new_event_loop()
            self.suite = Suite(self.target, self.model, self.options)
            self.loop.run_until_complete(self.suite.open())
        return self.loop.run_until_complete(self.suite.run_check(c))

    def close(self) -> None:
        if self.suite is not None:
            self.loop.run_until_complete(self.suite.close())
            self.loop.close()


class ConformanceItem(pytest.Item):
    def __init__(self, *, check: Check, state: _Session, **kw) -> None:
        super().__init__(**kw)
        self.check = check
        self.state = state
        self.add_marker(pytest.mark.conformance)

    def runtest(self) -> None:
        res = self.state.run(self.check)
        if res.status == SKIP:
            pytest.skip(res.reason)
        if res.status == FAIL:
            raise ConformanceFailure(res.reason)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.check.name} ({self.check.requires}): {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return "conformance", None, f"conformance::{self.check.name}"


class ConformanceFailure(Exception):
    pass


def pytest_configure(config):
    config.addinivalue_line("markers", "conformance: an OpenEngine conformance check")


def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("conformance_target"):
        return
    state = _Session(config)
    config._conformance_state = state
    for c in select(all_checks(), config.getoption("conformance_only")):
        items.append(ConformanceItem.from_parent(session, name=f"conformance::{c.name}", check=c, state=state))


def pytest_unconfigure(config):
    state = getattr(config, "_conformance_state", None)
    if state is not None:
        state.close()
