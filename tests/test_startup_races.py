"""Start-up without races for the endpoints a launcher chooses for its engine (issue 25, item 3).

The engine binds the KV-event publisher's endpoints a minute after the launcher chose them. With
one rank they are ``ipc://`` sockets in a fresh 0700 directory (nothing another process can take);
with more ranks (the engines accept ipc only for rank 0) loopback ports, and an engine start that
lost the race for one is retried with fresh ports. Here the "engine" is a ZMQ PUB and ROUTER binding
the endpoints as vLLM's and SGLang's ``ZmqEventPublisher`` do, and the other process is the test
holding the candidate ports busy."""

from __future__ import annotations

import os
import socket
import stat

import pytest
import zmq

from openengine_adapters import launcher
from openengine_adapters.kv_events.sources import split_tcp


def engine_binds(endpoint: str, replay: str, ranks: int = 1) -> list[zmq.Socket]:
    """What the engine's publisher does at start-up: bind both endpoints (per rank, offset ports)."""
    ctx = zmq.Context.instance()
    socks = []
    try:
        for rank in range(ranks):
            for kind, ep in ((zmq.PUB, endpoint), (zmq.ROUTER, replay)):
                parts = split_tcp(ep)
                s = ctx.socket(kind)
                s.setsockopt(zmq.LINGER, 0)
                socks.append(s)
                s.bind(f"tcp://{parts[0]}:{parts[1] + rank}" if parts else ep)
    except zmq.ZMQError:
        for s in socks:
            s.close()
        raise
    return socks


def test_one_rank_gets_ipc_sockets_in_a_directory_only_this_user_reaches():
    pub, replay = launcher.private_endpoints(1)
    assert pub.startswith("ipc://") and replay.startswith("ipc://")
    directory = os.path.dirname(pub[len("ipc://"):])
    assert directory == os.path.dirname(replay[len("ipc://"):])
    mode = os.stat(directory)
    assert stat.S_IMODE(mode.st_mode) == 0o700 and mode.st_uid == os.getuid()
    socks = engine_binds(pub, replay)  # the engine's publisher binds them
    try:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(pub)  # the bridge connects as the kv_events bridge does (sources.local_address)
        sub.close()
    finally:
        for s in socks:
            s.close()
    assert launcher.private_endpoints(1) != (pub, replay)  # a fresh directory per choice


def test_more_ranks_get_loopback_port_runs():
    pub, replay = launcher.private_endpoints(3)
    assert split_tcp(pub)[0] == split_tcp(replay)[0] == "127.0.0.1"
    socks = engine_binds(pub, replay, ranks=3)
    for s in socks:
        s.close()


async def test_an_engine_start_that_loses_a_port_race_is_retried_with_fresh_ports():
    """The first two choices are taken by 'another process' (the test) between the choice and the
    engine's bind; the third start binds. Before issue 25 the first failure ended the launcher."""
    ranks = 2
    held: list[socket.socket] = []
    chosen = list(launcher.loopback_endpoints(ranks))
    starts, choices = [], [tuple(chosen)]

    def squat(endpoints) -> None:  # another process binds the chosen ports before the engine does
        for ep in endpoints:
            host, port = split_tcp(ep)
            for p in range(port, port + ranks):
                s = socket.socket()
                s.bind((host, p))
                s.listen()
                held.append(s)

    def choose_again() -> None:
        chosen[:] = launcher.loopback_endpoints(ranks)
        choices.append(tuple(chosen))
        if len(choices) < 3:
            squat(chosen)

    async def start():
        starts.append(tuple(chosen))
        return engine_binds(*chosen, ranks=ranks)

    squat(chosen)
    try:
        socks = await launcher.start_retrying_port_races(start, lambda: chosen, choose_again, ranks=ranks)
        assert len(starts) == 3 and len(set(choices)) == 3
        for s in socks:
            s.close()
    finally:
        for s in held:
            s.close()


async def test_a_failure_that_is_no_port_race_is_not_retried_and_races_are_retried_a_bounded_number_of_times():
    calls = []

    async def broken():
        calls.append(1)
        raise RuntimeError("the model does not load")

    with pytest.raises(RuntimeError, match="does not load"):
        await launcher.start_retrying_port_races(broken, lambda: list(launcher.loopback_endpoints(1)),
                                                 lambda: None)
    assert len(calls) == 1
    with socket.socket() as busy:  # always lost: three starts, then the failure
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        endpoint = f"tcp://127.0.0.1:{busy.getsockname()[1]}"

        async def loses():
            calls.append(2)
            engine_binds(endpoint, endpoint)

        with pytest.raises(zmq.ZMQError):
            await launcher.start_retrying_port_races(loses, lambda: [endpoint], lambda: None)
    assert calls.count(2) == 3
