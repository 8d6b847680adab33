"""SGLang's lifecycle as the sidecar runs it: start and shutdown, Health from SGLang's own status, the
watchdog's probe inference, and a dead scheduler or detokenizer taken over from SGLang's SIGQUIT.

A mixin of ``SglangBackend``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from openengine_adapters import backend as be
from openengine_adapters.sglang import disagg, request_mapping
from openengine_adapters.types import EngineRole, HealthState

log = logging.getLogger(__name__)


class SglangLifecycle:
    """Start, shutdown, health, probe and death of ``SglangBackend``."""

    async def start(self) -> None:
        self.tm.auto_create_handle_loop()
        if self.owns_engine:
            self._take_over_child_death()
        if self._stats is not None:
            self._stats.start()
        await self.kv_publishers.start()

    def _take_over_child_death(self) -> None:
        """SGLang learns of a dead scheduler or detokenizer by a SIGQUIT (sent by the child's own
        exception handler, or within 1 s of a hard crash by its ``SubprocessWatchdog``), and its handler
        (``SignalHandler.running_phase_sigquit_handler``) kills this whole process tree at once: every
        stream would end with a lost connection, no terminal error. The sidecar, which owns the
        engine, takes the signal over instead: ``dead()`` names the process, the server ends every
        stream with its retryable error and exits (docs/lifecycle.md). ``sglang serve`` with the
        plugin keeps SGLang's own handling (the plugin follows its host server)."""
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, self._child_died)

    def _child_died(self) -> None:
        watchdog = getattr(self.tm, "_subprocess_watchdog", None)
        gone = []
        if watchdog is not None:
            watchdog.stop()
            for proc, name in zip(getattr(watchdog, "_processes", ()), getattr(watchdog, "_names", ()),
                                  strict=False):
                if not proc.is_alive() and proc.exitcode != 0:
                    gone.append(f"{name} (pid {proc.pid}, exit code {proc.exitcode})")
        if self._dead_reason is None:
            self._dead_reason = ("an SGLang engine process died: " + ", ".join(gone) if gone
                                 else "an SGLang engine process failed (it signalled SIGQUIT)")
            log.error("%s", self._dead_reason)

    def dead(self) -> str | None:
        return self._dead_reason

    async def shutdown(self) -> None:
        if self._stats is not None:
            await self._stats.stop()
        await self.kv_publishers.stop()
        if self.owns_engine and self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)

    async def check_health(self) -> list[be.HealthCheckResult]:
        """SGLang's ``server_status``: an ``Engine`` leaves it at Starting once started (only the
        HTTP server's warmup sets Up), so Starting counts as up when we own an Engine and as
        STARTING under ``sglang serve``."""
        from sglang.srt.managers.tokenizer_manager import ServerStatus

        status = getattr(self.tm, "server_status", None)
        if getattr(self.tm, "gracefully_exit", False):
            return [be.HealthCheckResult("scheduler", HealthState.NOT_READY, "SGLang is shutting down")]
        if status == ServerStatus.UnHealthy:
            return [be.HealthCheckResult("scheduler", HealthState.NOT_READY, "SGLang reports itself unhealthy")]
        if status == ServerStatus.Starting and self.engine is None:
            return [be.HealthCheckResult("scheduler", HealthState.STARTING, "SGLang is warming up")]
        checks = [be.HealthCheckResult("scheduler", HealthState.READY, "SGLang scheduler is up"),
                  be.HealthCheckResult("model", HealthState.READY, self._card.names[0])]
        if getattr(self.tm, "is_pause", False):
            checks.append(be.HealthCheckResult("scheduler", HealthState.DEGRADED, "SGLang generation is paused"))
        return checks

    async def probe(self, model: str, role: EngineRole) -> None:
        """A 1-token inference; PD roles use SGLang's fake bootstrap host (no peer, no transfer),
        as SGLang's own health check does."""
        if not self.is_generation:
            await self._encode([{"input_ids": [1]}], f"openengine-health-probe-{time.monotonic_ns()}")
            return
        if role == EngineRole.AGGREGATED or self.role == EngineRole.AGGREGATED:
            await super().probe(model, role)
            return
        from sglang.srt.managers.io_struct import GenerateReqInput

        rid = request_mapping.engine_rids(f"openengine-health-probe-{time.monotonic_ns()}", 1)[0]
        obj = GenerateReqInput(rid=rid, input_ids=[1], stream=False,
                               sampling_params={"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True},
                               bootstrap_host=disagg.FAKE_BOOTSTRAP_HOST, bootstrap_port=self.bootstrap_port,
                               bootstrap_room=disagg.new_bootstrap_room())
        last = None
        try:
            async for out in self.tm.generate_request(obj, None):
                last = out
        finally:
            if last is None or last["meta_info"].get("finish_reason") is None:
                self.tm.abort_request(rid=rid)
        reason = (last or {}).get("meta_info", {}).get("finish_reason") or {}
        if reason.get("type") == "abort":
            raise RuntimeError(f"probe aborted: {reason.get('message')}")
