"""Engine-native ZMQ KV-event publishers: their endpoints and their ``KvEventSource`` advertisement."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openengine_adapters.backend import KvEndpoint, KvEventSourceInfo
from openengine_adapters.validation.kv import WILDCARD_HOSTS

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/]*):(?P<port>\d+)$")


@dataclass(frozen=True)
class PublisherConfig:
    """One rank's publisher as the engine resolved it (vLLM ``KVEventsConfig``, SGLang's JSON)."""

    data_parallel_rank: int
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int | None = None
    hwm: int | None = None
    max_queue_size: int | None = None

    @classmethod
    def from_config(cls, rank: int, cfg: Any) -> PublisherConfig:
        get = cfg.get if isinstance(cfg, Mapping) else lambda k, d=None: getattr(cfg, k, d)
        return cls(rank, get("endpoint"), get("replay_endpoint") or None, get("topic") or "",
                   get("buffer_steps"), get("hwm"), get("max_queue_size"))


def publisher_binds(endpoint: str) -> bool:
    """vLLM's rule (``ZmqEventPublisher._is_bind_endpoint``): the publisher binds wildcard and
    ipc/inproc endpoints and connects to the rest (then the subscriber must bind)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def split_tcp(endpoint: str) -> tuple[str, int] | None:
    m = _TCP.match(endpoint)
    if m is None:
        return None
    return m.group("host").strip("[]") if m.group("host").startswith("[") else m.group("host"), int(m.group("port"))


def with_host(endpoint: str, host: str) -> str:
    """``tcp://*:5557`` -> ``tcp://<host>:5557`` when the host is a bind wildcard; others unchanged."""
    parts = split_tcp(endpoint)
    if parts is None or parts[0] not in WILDCARD_HOSTS:
        return endpoint
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{parts[1]}"


def local_address(endpoint: str) -> str:
    """Where a subscriber on the engine's own host connects to a publisher bound at ``endpoint``."""
    parts = split_tcp(endpoint)
    if parts is not None and parts[0] in ("::", ""):
        return with_host(endpoint, "::1")
    return with_host(endpoint, "127.0.0.1")


def kv_endpoint(endpoint: str) -> KvEndpoint:
    parts = split_tcp(endpoint)
    if parts is not None:
        return KvEndpoint(parts[0], parts[1], "tcp")
    scheme, _, rest = endpoint.partition("://")
    return KvEndpoint(rest, 0, scheme or "zmq")


def source_info(pub: PublisherConfig, replay_host: str) -> KvEventSourceInfo:
    """The advertisement of one publisher. A wildcard ``endpoint_addr`` host is left for the service
    to replace with its advertise host; the replay endpoint gets ``replay_host`` (routable) here."""
    return KvEventSourceInfo(
        transport="zmq",
        endpoint_addr=kv_endpoint(pub.endpoint),
        topic=pub.topic,
        replay_endpoint=with_host(pub.replay_endpoint, replay_host) if pub.replay_endpoint else "",
        data_parallel_rank=pub.data_parallel_rank,
        encoding="msgpack",
        buffer_steps=pub.buffer_steps,
        hwm=pub.hwm,
        max_queue_size=pub.max_queue_size,
    )


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """vLLM's per-rank endpoint (``ZmqEventPublisher.offset_endpoint_port``)."""
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    parts = split_tcp(endpoint)
    if parts is not None and parts[1] != 0:
        return endpoint[: endpoint.rfind(":")] + f":{parts[1] + rank}"
    return endpoint
