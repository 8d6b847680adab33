"""SGLang's load snapshots, read off the event loop.

``TokenizerManager.get_loads`` (SGLang 0.5.x, ``srt/managers/tokenizer_control_mixin.py``) reads the
schedulers' shared-memory snapshots in the calling thread under a blocking ``flock``
(``srt/managers/load_snapshot.py``, ``ShmLoadSnapshotReader.read_all``), and a scheduler holds that
lock while it writes its snapshot. A scheduler stopped while holding it (SIGSTOP, a debugger, a host
swapping) froze the sidecar's whole event loop: every RPC, the watchdogs and Health with it. Here the
read runs in a worker thread, one at a time, and GetLoad and the runtime-event poller get ``None``
for a read that takes longer than ``SNAPSHOT_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
from typing import Any

SNAPSHOT_TIMEOUT_S = 1.0  # an unlocked read takes microseconds


class LoadReads:
    """Single-flight reads of one TokenizerManager's load snapshots: callers arriving while a read is
    under way share it, so a stuck lock holds one worker thread, not one per GetLoad."""

    def __init__(self, tm: Any, timeout_s: float = SNAPSHOT_TIMEOUT_S) -> None:
        self.tm = tm
        self.timeout_s = timeout_s
        self._read: asyncio.Future | None = None

    async def snapshots(self) -> list | None:
        """SGLang's snapshots, one per DP rank; None while the read waits on a scheduler's lock."""
        if self._read is None or self._read.done():
            self.tm.auto_create_handle_loop()  # what get_loads does first
            self._read = asyncio.ensure_future(asyncio.to_thread(self.tm.load_snapshot_reader.read_all))
        try:
            return await asyncio.wait_for(asyncio.shield(self._read), self.timeout_s)
        except TimeoutError:
            return None
