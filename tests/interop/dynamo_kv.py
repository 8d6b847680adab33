"""Dynamo's reader of OpenEngine KV events, replayed in Python from its Rust source.

Source: ai-dynamo/dynamo lib/sidecar/openengine/src/kv.rs at 0cc34d9904da51f01556efab36eb268395d0ef81
(``discover_sources``, ``subscribe_loop``, ``accept_sequence``, ``convert_event``, ``block_hash``).
That sidecar is newer than the v0.1.0-pinned one (3770f0cf), but it reads the same v0.1.0
``GetKvEventSources`` / ``SubscribeKvEvents`` messages.
"""

from __future__ import annotations

from dynamo_openengine import ClientRefused

from openengine_adapters.v0_1 import kv_pb2

SOURCE = "ai-dynamo/dynamo lib/sidecar/openengine/src/kv.rs @ 0cc34d9904da51f01556efab36eb268395d0ef81"
WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


def expected_ranks(info) -> set[int]:
    """engine.rs ``advertised_dp_ranks`` / ``setup_metrics``: start..start+size (size at least 1)."""
    par = info.parallelism
    start = par.data_parallel_start_rank if par.HasField("data_parallel_start_rank") else 0
    size = max(1, par.data_parallel_size if par.HasField("data_parallel_size") else 1)
    return set(range(start, start + size))


def discover_sources(control, info, timeout: float = 10.0) -> list[dict]:
    """kv.rs ``discover_sources``: every source names its rank, once, inside the data-parallel range;
    ``zmq`` must be msgpack with a connectable endpoint, ``grpc`` must be protobuf; other transports
    are skipped; a non-empty list must leave no rank without a usable source."""
    response = control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(), timeout=timeout)
    expected = expected_ranks(info)
    seen, usable, out = set(), set(), []
    for src in response.sources:
        if not src.HasField("data_parallel_rank"):
            raise ClientRefused("OpenEngine KV event source omitted data_parallel_rank")
        rank = src.data_parallel_rank
        if rank in seen:
            raise ClientRefused(f"OpenEngine advertised duplicate KV event source for rank {rank}")
        seen.add(rank)
        if rank not in expected:
            raise ClientRefused(f"OpenEngine advertised KV event source rank {rank} outside its data-parallel range")
        if src.transport == "zmq":
            if src.encoding != "msgpack":
                raise ClientRefused(f"ZMQ KV source for rank {rank} uses unsupported encoding `{src.encoding}`")
            ep = src.endpoint_addr
            if not src.HasField("endpoint_addr") or not ep.host or ep.host in WILDCARDS or not 0 < ep.port <= 65535:
                raise ClientRefused(f"ZMQ KV source for rank {rank} omitted a connectable endpoint")
            out.append({"transport": "zmq", "rank": rank,
                        "endpoint": f"{ep.protocol or 'tcp'}://{ep.host}:{ep.port}", "topic": src.topic})
            usable.add(rank)
        elif src.transport == "grpc":
            if src.encoding != "protobuf":
                raise ClientRefused(f"gRPC KV source for rank {rank} uses unsupported encoding `{src.encoding}`")
            out.append({"transport": "grpc", "rank": rank})
            usable.add(rank)
    if seen and usable != expected:
        raise ClientRefused(f"OpenEngine KV event discovery omitted data-parallel ranks {sorted(expected - usable)}")
    return out


def subscription_request(rank: int) -> kv_pb2.SubscribeKvEventsRequest:
    """kv.rs ``subscription_request``: one rank, live only (no snapshot, no replay)."""
    return kv_pb2.SubscribeKvEventsRequest(data_parallel_ranks=[rank], include_snapshot=False,
                                           start_sequence_number=0)


def block_hash(h: kv_pb2.KvBlockHash) -> int:
    """kv.rs ``block_hash``: only canonical ASCII-decimal int64 (``decimal_int64``) is accepted."""
    if h.encoding != "decimal_int64":
        raise ClientRefused(f"KV block hash encoding `{h.encoding}` is not canonical decimal_int64")
    try:
        text = h.value.decode("ascii")
        value = int(text)
    except (UnicodeDecodeError, ValueError):
        raise ClientRefused("KV block hash is not a signed int64 decimal") from None
    if str(value) != text or not -(2**63) <= value < 2**63:
        raise ClientRefused("KV block hash is not canonically encoded")
    return value % 2**64


class Subscriber:
    """kv.rs ``subscribe_loop`` for one rank: batch rank must be the subscribed one, sequence
    numbers consecutive (``accept_sequence``), each BlockStored well formed (``convert_event``)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.last: int | None = None
        self.events: list[tuple] = []

    def batch(self, batch: kv_pb2.KvEventBatch) -> None:
        if batch.data_parallel_rank != self.rank:
            raise ClientRefused(f"OpenEngine KV stream for rank {self.rank} returned batch rank "
                                f"{batch.data_parallel_rank}")
        if self.last is not None and batch.sequence_number != self.last + 1:
            raise ClientRefused(f"OpenEngine KV stream for rank {self.rank} is non-monotonic "
                                f"({self.last} then {batch.sequence_number})")
        self.last = batch.sequence_number
        for event in batch.events:
            self.events.append(self.convert(event))

    @staticmethod
    def convert(event: kv_pb2.KvEvent) -> tuple:
        kind = event.WhichOneof("event")
        if kind is None:
            raise ClientRefused("KvEvent omitted its event payload")
        if kind == "block_stored":
            s = event.block_stored
            if s.block_size == 0:
                raise ClientRefused("BlockStored block_size must be non-zero")
            if s.kv_cache_spec_kind or s.kv_cache_spec_sliding_window:
                raise ClientRefused("unsupported KV cache group/spec metadata")
            if s.lora_id != 0 and not s.lora_name:
                raise ClientRefused("BlockStored with a non-zero LoRA ID omitted its name")
            if len(s.token_ids) != s.block_size * len(s.block_hashes):
                raise ClientRefused(f"BlockStored has {len(s.token_ids)} tokens for {len(s.block_hashes)} block(s) "
                                    f"of size {s.block_size}")
            hashes = [block_hash(h) for h in s.block_hashes]
            parent = block_hash(s.parent_block_hash) if s.HasField("parent_block_hash") else None
            return ("stored", parent, hashes, list(s.token_ids), s.block_size)
        if kind == "block_removed":
            return ("removed", [block_hash(h) for h in event.block_removed.block_hashes])
        return ("cleared",)
