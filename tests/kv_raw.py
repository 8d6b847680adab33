"""An engine's raw ZMQ KV-event stream, read independently of the bridge, to compare with it."""

from __future__ import annotations

import threading

import zmq

# msgpack event tag -> the KvEvent oneof field it becomes
KIND = {"BlockStored": "block_stored", "BlockRemoved": "block_removed", "AllBlocksCleared": "all_blocks_cleared"}


class RawCollector:
    """An independent SUB socket on the engine's publisher: every ``(seq, payload)`` it sends."""

    def __init__(self, address: str, topic: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.connect(address)
        self.batches: list[tuple[int, bytes]] = []
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            if self.sock.poll(20):
                _topic, seq, payload = self.sock.recv_multipart()
                self.batches.append((int.from_bytes(seq, "big"), payload))

    def close(self):
        self.running = False
        self.thread.join(2)
        self.ctx.destroy(linger=0)


def raw_hash(h) -> tuple[bytes, str]:
    """A msgpack block hash as the bridge encodes it: ints as 8-byte two's complement."""
    return ((h & (2**64 - 1)).to_bytes(8, "big"), "int64") if isinstance(h, int) else (bytes(h), "bytes")


def pb_hash(h) -> tuple[bytes, str]:
    return h.value, h.encoding
