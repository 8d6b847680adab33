"""OpenEngine health: the backend's checks, the role, the drain state, the progress watchdog
(``core.watchdog``: a hung or dead engine is NOT_READY) and an optional probe.

The same state drives the standard ``grpc.health.v1`` service (SERVING only when READY or
DEGRADED), refreshed by a background monitor and immediately on drain.
"""

from __future__ import annotations

import asyncio
import logging
import time

from grpc_health.v1 import health, health_pb2

from openengine_adapters.backend import EngineBackend, HealthCheckResult
from openengine_adapters.core.drain import Lifecycle
from openengine_adapters.types import EngineRole, HealthState

log = logging.getLogger(__name__)

# Which state wins when checks disagree.
_SEVERITY = {HealthState.READY: 0, HealthState.DEGRADED: 1, HealthState.STARTING: 2,
             HealthState.NOT_READY: 3, HealthState.UNSPECIFIED: 3, HealthState.DRAINING: 4}


def overall(checks: list[HealthCheckResult], draining: bool) -> HealthState:
    if draining:
        return HealthState.DRAINING
    return max((c.state for c in checks), key=_SEVERITY.__getitem__, default=HealthState.READY)


class HealthReporter:
    def __init__(self, backend: EngineBackend, lifecycle: Lifecycle, role: EngineRole,
                 grpc_health: health.aio.HealthServicer | None = None,
                 probe_timeout_s: float = 30.0) -> None:
        self.backend = backend
        self.lifecycle = lifecycle
        self.role = role
        self.grpc_health = grpc_health
        self.service_names: tuple[str, ...] = ()  # the served OpenEngine services, set by the server
        self.probe_timeout_s = probe_timeout_s
        self.state = HealthState.STARTING
        self.watchdog = None  # core.watchdog.Watchdog: a hung or dead engine is NOT_READY
        lifecycle.listeners.append(lambda: asyncio.ensure_future(self.refresh()))

    async def _backend_checks(self) -> list[HealthCheckResult]:
        try:
            return list(await self.backend.check_health())
        except Exception as exc:  # a broken check is a NOT_READY check, never a crash
            return [HealthCheckResult("scheduler", HealthState.NOT_READY, f"health check failed: {exc}")]

    async def report(self, probe_model: str | None = None,
                     expected_role: EngineRole = EngineRole.UNSPECIFIED
                     ) -> tuple[HealthState, list[HealthCheckResult]]:
        checks = [HealthCheckResult("grpc", HealthState.READY, "serving")]
        checks += await self._backend_checks()
        wd = self.watchdog
        if wd is not None and wd.dead_reason:
            checks.append(HealthCheckResult("progress", HealthState.NOT_READY, f"the engine died: {wd.dead_reason}"))
        elif wd is not None and wd.hung:
            checks.append(HealthCheckResult(
                "progress", HealthState.NOT_READY,
                f"hung: work was pending and the engine made no progress for over {wd.progress_timeout_s:g} s; "
                "NOT_READY until it makes progress (a probe inference is running)"))
        if expected_role not in (EngineRole.UNSPECIFIED, self.role):
            checks.append(HealthCheckResult(
                "role", HealthState.NOT_READY,
                f"expected role {expected_role.name}, engine role is {self.role.name}"))
        else:
            checks.append(HealthCheckResult("role", HealthState.READY, self.role.name))
        if probe_model is not None:
            checks.append(await self._probe(probe_model))
        if self.lifecycle.draining:
            checks.append(HealthCheckResult("drain", HealthState.DRAINING, "not accepting new requests"))
        state = overall(checks, self.lifecycle.draining)
        self._publish(state)
        return state, checks

    async def _probe(self, model: str) -> HealthCheckResult:
        start = time.monotonic()
        try:
            await asyncio.wait_for(self.backend.probe(model, self.role), self.probe_timeout_s)
        except TimeoutError:
            return HealthCheckResult("inference_probe", HealthState.NOT_READY,
                                     f"probe timed out after {self.probe_timeout_s:g} s")
        except Exception as exc:
            return HealthCheckResult("inference_probe", HealthState.NOT_READY, f"probe failed: {exc}")
        ms = (time.monotonic() - start) * 1000
        if self.watchdog is not None:
            self.watchdog.progress += 1  # a finished inference is progress: a hung engine has recovered
        return HealthCheckResult("inference_probe", HealthState.READY,
                                 f"{self.role.name.lower()} probe of {model!r} ok in {ms:.1f} ms")

    async def refresh(self) -> HealthState:
        state, _ = await self.report()
        return state

    def _publish(self, state: HealthState) -> None:
        self.state = state
        if self.grpc_health is None:
            return
        serving = (health_pb2.HealthCheckResponse.SERVING
                   if state in (HealthState.READY, HealthState.DEGRADED)
                   else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", *self.service_names):
            asyncio.ensure_future(self.grpc_health.set(name, serving))

    async def monitor(self, interval_s: float) -> None:
        """Keep grpc.health.v1 in step with the engine until cancelled."""
        while True:
            try:
                await self.refresh()
            except Exception:  # pragma: no cover - report() does not raise
                log.exception("health refresh failed")
            await asyncio.sleep(interval_s)
