"""Run the registered checks against one target and collect a Report."""

from __future__ import annotations

import asyncio
import fnmatch
import time
import traceback

import grpc

from conformance.checks import all_checks
from conformance.context import Ctx, Options
from conformance.registry import Check, Skip
from conformance.report import FAIL, PASS, SKIP, Report, Result
from openengine_adapters.wire.v0_1.stub import NotOnSurface

# Embed/Classify/Score and SubscribeRuntimeEvents exist in revision 1 only
REVISION1_ONLY_DOMAINS = frozenset({"tasks", "runtime"})


def select(checks: list[Check], only: str | None) -> list[Check]:
    """``only`` is a comma-separated list of glob patterns or substrings of check names."""
    if not only:
        return checks
    pats = [p.strip() for p in only.split(",") if p.strip()]
    return [c for c in checks if any(fnmatch.fnmatchcase(c.name, p) or p in c.name for p in pats)]


class Suite:
    """A suite run: ``await open()``, then ``await run_check(c)`` for each check, then ``close()``."""

    def __init__(self, target: str, model: str | None = None, options: Options | None = None) -> None:
        self.ctx = Ctx(target, model, options or Options())
        self.report = Report(target)
        self.setup_error: str | None = None

    async def open(self) -> None:
        try:
            await self.ctx.open()
        except grpc.aio.AioRpcError as exc:
            what = "GetServerInfo" if self.ctx.options.contract == "v0.1.0" else "GetEngineInfo"
            self.setup_error = f"{what} failed: {exc.code().name}: {exc.details()}"
            return
        info = self.ctx.engine_info
        self.report.model = self.ctx.model
        self.report.engine = {"engine": info.engine_name, "version": info.engine_version,
                              "role": self.ctx.role_name, "schema_revision": info.schema_revision,
                              "schema_release": info.schema_release, "contract": self.ctx.options.contract}

    async def close(self) -> None:
        await self.ctx.close()

    async def run_check(self, c: Check) -> Result:
        res = Result(c.name, c.domain, PASS, requires=c.requires, destructive=c.destructive)
        start = time.monotonic()
        if self.setup_error:
            res.status, res.reason = FAIL, self.setup_error
        elif self.ctx.options.contract == "v0.1.0" and c.domain in REVISION1_ONLY_DOMAINS:
            res.status, res.reason = SKIP, f"{c.domain}: not part of the v0.1.0 contract (revision 1 only)"
        elif c.destructive and not self.ctx.options.destructive:
            res.status, res.reason = SKIP, "destructive (run with --destructive)"
        else:
            try:
                await asyncio.wait_for(c.func(self.ctx), self.ctx.options.check_timeout_s * 2)
            except Skip as exc:
                res.status, res.reason = SKIP, str(exc)
            except NotOnSurface as exc:
                res.status, res.reason = SKIP, str(exc)
            except AssertionError as exc:
                res.status, res.reason = FAIL, str(exc) or "assertion failed"
            except grpc.aio.AioRpcError as exc:
                res.status, res.reason = FAIL, f"unexpected gRPC status {exc.code().name}: {exc.details()}"
            except TimeoutError:
                res.status, res.reason = FAIL, f"timed out after {self.ctx.options.check_timeout_s * 2:g}s"
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                res.status, res.reason = FAIL, "an RPC was cancelled unexpectedly"
            except Exception as exc:  # noqa: BLE001 - a crashing check is a reported failure
                tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
                res.status, res.reason = FAIL, f"check raised {tb}"
        res.duration_s = round(time.monotonic() - start, 3)
        self.report.results.append(res)
        return res


async def run_suite_async(target: str, model: str | None = None, destructive: bool = False,
                          only: str | None = None, expect_admission_limit: int | None = None,
                          long_metadata: dict[str, str] | None = None, check_timeout_s: float = 60.0,
                          progress=None, contract: str = "revision-1", **transport) -> Report:
    """``transport``: Options' tls, tls_ca_file, tls_cert_file, tls_key_file and token, and the opt-in engine
    hooks fail_metadata, serial_metadata and lora_dir."""
    options = Options(contract=contract, destructive=destructive, expect_admission_limit=expect_admission_limit,
                      long_metadata=dict(long_metadata or {}), check_timeout_s=check_timeout_s, **transport)
    suite = Suite(target, model, options)
    await suite.open()
    if suite.setup_error:  # nothing can be checked: one error, not one failure per check
        await suite.close()
        suite.report.setup_error = suite.setup_error
        return suite.report
    try:
        for c in select(all_checks(), only):
            res = await suite.run_check(c)
            if progress is not None:
                progress(res)
    finally:
        await suite.close()
    return suite.report


def run_suite(target: str, model: str | None = None, destructive: bool = False, **kw) -> Report:
    """Run the whole suite (blocking) and return its Report; ``report.ok`` is False on any failure."""
    return asyncio.run(run_suite_async(target, model, destructive, **kw))
