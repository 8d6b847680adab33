#!/usr/bin/env python3
"""The images' HEALTHCHECK (installed as /usr/local/bin/openengine-healthcheck).

Asks the container's OpenEngine server ``grpc.health.v1.Health/Check`` (the overall service "")
and exits 0 only for SERVING. Target: ``$OPENENGINE_HEALTHCHECK_TARGET`` when set; in plugin mode
127.0.0.1:``$OPENENGINE_GRPC_PORT``; else the ``--host``/``--port`` the sidecar was started with
(read from the container's first process), default 127.0.0.1:50051.
"""

import os
import sys

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def flag(args: list[str], name: str) -> str | None:
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value  # the last one wins, as with argparse


def target() -> str:
    if explicit := os.environ.get("OPENENGINE_HEALTHCHECK_TARGET"):
        return explicit
    if os.environ.get("OPENENGINE_MODE") == "plugin":
        return "127.0.0.1:" + os.environ.get("OPENENGINE_GRPC_PORT", "50051")
    with open("/proc/1/cmdline", "rb") as f:
        args = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    host = flag(args, "--host") or ""
    host = "127.0.0.1" if host in WILDCARDS else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{host}:{flag(args, '--port') or '50051'}"


def main() -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    where = target()
    try:
        with grpc.insecure_channel(where) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=4)
    except grpc.RpcError as exc:
        print(f"{where}: {exc.code().name}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{where}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
