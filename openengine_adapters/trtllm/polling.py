"""TensorRT-LLM's single-consumer engine queues (iteration stats, KV-cache events), each drained
by one poller that this adapter runs: no other reader may take from them.

A mixin of ``TrtllmBackend``.
"""

from __future__ import annotations

import asyncio
import json
import logging

log = logging.getLogger(__name__)


class EngineQueuePolling:
    """The pollers of ``TrtllmBackend``."""

    async def _poll(self, read, sink) -> None:
        """Drain one single-consumer engine queue forever (this adapter must be its only reader).

        TensorRT-LLM hands out one ``IterationResult`` per queue (``executor/result.py``): once a
        read times out it stays done, so every later read ends at once, until ``mark_undone`` -
        which the executor calls only when a request is submitted. The poller marks it undone
        itself after each read, so events that come while no request arrives (evictions, the
        end of the last request) are not held back. Before the first request the KV queue does
        not exist yet (``executor/executor.py`` ``aget_kv_events`` asserts it): that is "not
        started", not a failure.
        """
        failed = False
        while True:
            try:
                it = read(timeout=self.options.poll_timeout_s)
                # a busy engine keeps the iteration going: handle every item as it arrives
                async for item in it:
                    sink([json.loads(item) if isinstance(item, str | bytes) else item])
                undone = getattr(it, "mark_undone", None)
                if undone is not None:
                    undone()
                if failed:
                    failed, self._poll_error = False, None
                    if sink == self._on_kv_events:
                        self.kv.engine_restarted()  # events may be lost while we could not read
            except asyncio.CancelledError:
                raise
            except AssertionError:
                if self._submitted:
                    self._poll_failed(read, "AssertionError: the engine queue is gone")
                    failed = True
                await asyncio.sleep(max(self.options.poll_interval_s, 0.1))
            except Exception as exc:
                if not failed:
                    log.warning("polling %s failed: %s", getattr(read, "__name__", read), exc)
                failed, self._poll_error = True, f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(max(self.options.poll_interval_s, 0.5))
            await asyncio.sleep(self.options.poll_interval_s)

    def _poll_failed(self, read, message: str) -> None:
        if self._poll_error is None:
            log.warning("polling %s failed: %s", getattr(read, "__name__", read), message)
        self._poll_error = message

    def _on_stats(self, items: list) -> None:
        for s in items:
            self.stats.record(s)

    def _on_kv_events(self, items: list) -> None:
        self.kv.ingest(items)
