"""sglang/load_reading.py: SGLang's load snapshots read off the event loop, under a real flock held by
another open file, as a scheduler holds it while writing (tests/sglang/test_control.py has the same
on the real engine)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from types import SimpleNamespace

import pytest

from openengine_adapters.sglang.load_reading import LoadReads


class Reader:
    """SGLang's ShmLoadSnapshotReader.read_all: LOCK_SH on the snapshot file, then the slots."""

    def __init__(self, path: str) -> None:
        self.path, self.started, self.reads = path, 0, 0

    def read_all(self) -> list:
        self.started += 1
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            self.reads += 1
            return [SimpleNamespace(dp_rank=0, num_running_reqs=1)]
        finally:
            os.close(fd)


@pytest.mark.asyncio
async def test_a_held_lock_answers_none_in_time_and_one_read_is_shared(tmp_path):
    path = tmp_path / "loads.shm"
    path.write_bytes(b"\0" * 64)
    reader = Reader(str(path))
    tm = SimpleNamespace(load_snapshot_reader=reader, auto_create_handle_loop=lambda: None)
    reads = LoadReads(tm, timeout_s=0.2)
    assert [s.num_running_reqs for s in await reads.snapshots()] == [1]
    writer = os.open(path, os.O_RDONLY)
    fcntl.flock(writer, fcntl.LOCK_EX)
    release = threading.Timer(5, fcntl.flock, (writer, fcntl.LOCK_UN))
    release.start()
    try:
        ticks = 0

        async def loop_runs() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(loop_runs())
        assert await asyncio.gather(reads.snapshots(), reads.snapshots(), reads.snapshots()) == [None] * 3
        assert await reads.snapshots() is None  # still the same read, still waiting
        ticker.cancel()
        assert ticks >= 20  # the event loop ran meanwhile
        assert reader.started == 2  # the first read and one more for the four callers, which waits
    finally:
        release.cancel()
        fcntl.flock(writer, fcntl.LOCK_UN)
        os.close(writer)
    await asyncio.sleep(0.1)
    assert [s.num_running_reqs for s in await reads.snapshots()] == [1]
    assert reader.reads == 3  # the first, the one that waited, the last
