"""KV events as Dynamo's KV-aware router consumes them (issue 24, item 3), replayed from its reader.

Reader: ai-dynamo/dynamo lib/sidecar/openengine/src/kv.rs at 0cc34d9904da51f01556efab36eb268395d0ef81
(tests/interop/dynamo_kv.py): GetKvEventSources, one live ``SubscribeKvEvents`` per advertised rank
(no snapshot, no replay), each batch's rank the subscribed one, sequence numbers consecutive,
each BlockStored ``block_size * len(block_hashes)`` tokens, then Dynamo's index: a stored block
hangs under its parent, which the index must already hold. A reconnect starts a new live stream.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from dynamo_kv import Subscriber, block_hash, subscription_request
from dynamo_openengine import ClientRefused, Preprocessed, ResponseState, build_generate_request, start_up
from replay import PROMPT, new_id, stream

from openengine_adapters.v0_1 import kv_pb2

# 160 tokens: a full KV block on every target (engines publish BlockStored for full blocks only, and vLLM's
# CPU backend keeps 128-token blocks; its attention backend takes only multiples of 32 as --block-size)
PROMPT = PROMPT * 4


class Stream:
    """One live subscription read in a thread, as ``subscribe_loop`` reads it."""

    def __init__(self, server, rank: int = 0) -> None:
        self.call = server.control.SubscribeKvEvents(subscription_request(rank), timeout=300)
        self.batches: list[kv_pb2.KvEventBatch] = []
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for response in self.call:
                if response.WhichOneof("event") == "batch":
                    self.batches.append(response.batch)
        except grpc.RpcError as exc:
            self.error = exc

    def close(self) -> list[kv_pb2.KvEventBatch]:
        self.call.cancel()
        self.thread.join(10)
        return self.batches


def _serve(server, tokens) -> None:
    disc = start_up(server.control)
    rid = new_id()
    r = Preprocessed(tokens, temperature=0.0, max_tokens=2)
    ResponseState(disc.mode, len(tokens)).read(stream(server, build_generate_request(r, rid, disc.remote_model,
                                                                                     disc.mode)), rid)


def _subscribable(target):
    for server in target.servers:
        if server.role == "decode":
            continue  # a decode leg stores the prefill's blocks: its index is fed by the handoff
        probe = server.control.SubscribeKvEvents(subscription_request(0), timeout=1)
        try:
            next(probe)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue
        finally:
            probe.cancel()
        return server
    pytest.skip(f"{target.name}: no typed KV event stream")


def _events(server, prompts):
    sub = Stream(server)
    time.sleep(0.3)  # the subscription is live before the requests (a live stream has no history)
    for tokens in prompts:
        _serve(server, tokens)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            e.WhichOneof("event") == "block_stored" for b in sub.batches for e in b.events):
        time.sleep(0.1)
    time.sleep(0.5)
    return sub.close()


def test_index_rebuilt_from_the_typed_stream(target):
    """Dynamo's reader accepts every batch (rank, consecutive sequence numbers, well-formed
    BlockStored) and its index holds together: each stored block's parent is already indexed, the
    stored tokens are the prompt's, a second request with the same prefix adds no conflicting hash."""
    server = _subscribable(target)
    other = [t + 1 for t in PROMPT]
    batches = _events(server, [PROMPT, PROMPT, other])
    assert batches, "no KV event batch while three requests ran"
    reader = Subscriber(0)
    index: dict[int, list[int]] = {}
    for batch in batches:
        reader.batch(batch)
        for event in batch.events:
            kind = event.WhichOneof("event")
            if kind == "block_stored":
                s = event.block_stored
                parent = block_hash(s.parent_block_hash) if s.HasField("parent_block_hash") else None
                assert parent is None or parent in index, f"parent {parent} not indexed (batch {batch.sequence_number})"
                for i, h in enumerate(s.block_hashes):
                    tokens = list(s.token_ids[i * s.block_size:(i + 1) * s.block_size])
                    assert index.setdefault(block_hash(h), tokens) == tokens, "one hash, two token blocks"
            elif kind == "block_removed":
                for h in event.block_removed.block_hashes:
                    index.pop(block_hash(h), None)
            elif kind == "all_blocks_cleared":
                index.clear()
    stored = [list(e.block_stored.token_ids) for b in batches for e in b.events
              if e.WhichOneof("event") == "block_stored"]
    flat = [t for ids in stored for t in ids]
    bs = next(e.block_stored.block_size for b in batches for e in b.events if e.WhichOneof("event") == "block_stored")
    assert PROMPT[:bs] == flat[:bs] or any(ids[:bs] == PROMPT[:bs] for ids in stored), stored


def test_a_reconnect_starts_a_consecutive_live_stream(target):
    """After a dropped subscription, ``subscribe_loop`` subscribes again, live: the new stream's
    batches are again consecutive for the rank, and later than anything the first one saw."""
    server = _subscribable(target)
    first = _events(server, [[t + 2 for t in PROMPT]])
    second = _events(server, [[t + 3 for t in PROMPT]])
    assert first and second
    reader = Subscriber(0)
    for batch in second:
        reader.batch(batch)
    assert second[0].sequence_number > first[-1].sequence_number


def test_block_hash_encoding_dynamo_reads(target):
    """Every block hash, parents and removals too, is the canonical decimal Dynamo's ``block_hash``
    parses: the targets run with ``--kv-block-hash-encoding decimal_int64`` (``conftest.dynamo_flags``),
    as a deployment behind Dynamo's KV router does."""
    server = _subscribable(target)
    batches = _events(server, [[t + 4 for t in PROMPT]])
    hashes = [h for b in batches for e in b.events if e.WhichOneof("event") == "block_stored"
              for h in [*e.block_stored.block_hashes,
                        *([e.block_stored.parent_block_hash] if e.block_stored.HasField("parent_block_hash") else [])]]
    assert hashes
    for h in hashes:
        block_hash(h)


def test_dynamo_refuses_upstreams_int64_bytes_and_reads_their_decimal():
    """Why the flag exists: by default v0.1.0 sends upstream's ``int64`` (8 big-endian bytes), which
    kv.rs ``block_hash`` @0cc34d99 refuses; ``decimal_int64`` carries the same value (negative int64s
    included) as the decimal it reads, and leaves an engine's other encodings alone."""
    from openengine_adapters.v1 import kv_pb2 as rev1_kv_pb2
    from openengine_adapters.wire.v0_1 import server_mapping

    def response(encoding: str = "int64"):
        out = rev1_kv_pb2.SubscribeKvEventsResponse()
        stored = out.batch.events.add().block_stored
        for value in (5, 2**63 + 5):  # the second is negative as a signed int64
            stored.block_hashes.add(value=value.to_bytes(8, "big"), encoding=encoding)
        stored.parent_block_hash.CopyFrom(rev1_kv_pb2.KvBlockHash(value=(7).to_bytes(8, "big"), encoding=encoding))
        out.batch.events.add().block_removed.block_hashes.add(value=(5).to_bytes(8, "big"), encoding=encoding)
        return out

    def hashes(resp):
        stored, removed = resp.batch.events[0].block_stored, resp.batch.events[1].block_removed
        return [*stored.block_hashes, stored.parent_block_hash, *removed.block_hashes]

    with pytest.raises(ClientRefused, match="not canonical decimal_int64"):
        block_hash(hashes(server_mapping.kv_events_batch(response()))[0])
    decimal = server_mapping.kv_events_batch(response(), "decimal_int64")
    assert [block_hash(h) for h in hashes(decimal)] == [5, 2**63 + 5, 7, 5]
    assert hashes(decimal)[1].value == b"-9223372036854775803"
    other = server_mapping.kv_events_batch(response("bytes"), "decimal_int64")
    assert [h.encoding for h in hashes(other)] == ["bytes"] * 4
