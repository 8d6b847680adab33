#!/usr/bin/env python3
"""The images' HEALTHCHECK (installed as /usr/local/bin/openengine-healthcheck).

Asks the container's OpenEngine server ``grpc.health.v1.Health/Check`` (the overall service "")
and exits 0 only for SERVING. ``openengine-healthcheck --alive`` (a liveness probe) exits 0 for any
answer, NOT_SERVING included: a draining server or a hung engine is out of rotation (readiness),
not a reason to restart the container; a dead engine ends the process itself. Target: ``$OPENENGINE_HEALTHCHECK_TARGET`` when set; in plugin mode
127.0.0.1:``$OPENENGINE_GRPC_PORT``; else the ``--host``/``--port`` the sidecar was started with
(read from the container's first process), default 127.0.0.1:50051.

A server serving TLS (``--tls-cert-file``, or ``$OPENENGINE_TLS_CERT_FILE`` in plugin mode) is asked
over TLS, trusting ``$OPENENGINE_HEALTHCHECK_CA_FILE`` (else the system's roots) and expecting the name
``$OPENENGINE_HEALTHCHECK_SERVER_NAME`` (else the target's host) in its certificate; with mTLS
(``--tls-client-ca-file``) the check shows ``$OPENENGINE_HEALTHCHECK_CERT_FILE`` and ``..._KEY_FILE``.
Kubernetes' own gRPC probes cannot speak TLS: this is the exec probe of a TLS deployment.
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


def first_process_args() -> list[str]:
    try:
        with open("/proc/1/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return []


def target(args: list[str]) -> str:
    if explicit := os.environ.get("OPENENGINE_HEALTHCHECK_TARGET"):
        return explicit
    if os.environ.get("OPENENGINE_MODE") == "plugin":
        return "127.0.0.1:" + os.environ.get("OPENENGINE_GRPC_PORT", "50051")
    host = flag(args, "--host") or ""
    host = "127.0.0.1" if host in WILDCARDS else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{host}:{flag(args, '--port') or '50051'}"


def channel(where: str, args: list[str]):
    """Plaintext, or TLS when the server serves TLS (the module docstring)."""
    import grpc

    if not (flag(args, "--tls-cert-file") or os.environ.get("OPENENGINE_TLS_CERT_FILE")):
        return grpc.insecure_channel(where)

    def read(variable: str) -> bytes | None:
        path = os.environ.get(variable)
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(read("OPENENGINE_HEALTHCHECK_CA_FILE"),
                                               read("OPENENGINE_HEALTHCHECK_KEY_FILE"),
                                               read("OPENENGINE_HEALTHCHECK_CERT_FILE"))
    name = os.environ.get("OPENENGINE_HEALTHCHECK_SERVER_NAME")
    options = [("grpc.ssl_target_name_override", name)] if name else []
    return grpc.secure_channel(where, credentials, options)


def main() -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    args = first_process_args()
    where = target(args)
    try:
        with channel(where, args) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=4)
    except grpc.RpcError as exc:
        print(f"{where}: {exc.code().name}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{where}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING or "--alive" in sys.argv[1:] else 1


if __name__ == "__main__":
    sys.exit(main())
