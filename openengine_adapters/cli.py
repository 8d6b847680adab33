"""openengine: a command-line client for any OpenEngine server, on the typed client.

    openengine [--target HOST:PORT] [--contract revision-1|v0.1.0] [TLS/token options] COMMAND ...

    info                      the server's identity (EngineInfo / ServerInfo) as JSON
    models                    each served model's ModelInfo as JSON
    health [--probe]          health state (READY, NOT_READY, ...) and checks (--probe: a minimal inference)
    load [--per-rank]         the engine's current load
    generate PROMPT           stream text as it arrives, then the finish reason and usage
                              (--json: every event as a JSON line)
    abort REQUEST_ID | --all  abort one request, or every request (an operator action)
    kv-events                 tail KV cache events as JSON lines (Ctrl-C to stop)
    runtime-events            tail runtime events as JSON lines (revision 1 only)

--target defaults to $OPENENGINE_TARGET or localhost:50051; --token to $OPENENGINE_API_KEY. JSON is
indented on a terminal and compact (one object a line) when piped or with --json.

exit status: 0 success; 1 the server refused or failed the call; 2 bad usage; 3 the server cannot be
reached (not running, wrong address, TLS mismatch); 4 credentials refused (UNAUTHENTICATED,
PERMISSION_DENIED); 5 not found (an unknown model); 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable

# gRPC's core logs a failed TLS handshake on stderr as well; the CLI says it in its one line
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402
from google.protobuf import json_format

from openengine_adapters.client import (
    AuthenticationRefused,
    IncompatibleServer,
    NotFound,
    NotOnSurface,
    OpenEngineClient,
    OpenEngineError,
    ServerUnreachable,
    typed_error,
)
from openengine_adapters.security.channel import add_client_args
from openengine_adapters.v1 import error_pb2, lifecycle_pb2
from openengine_adapters.v1 import generation_pb2 as g

DEFAULT_TARGET = "localhost:50051"
HEALTH = {v: k.removeprefix("HEALTH_STATE_") for k, v in lifecycle_pb2.HealthState.items()}  # as the contract
EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_NOT_FOUND = 1, 2, 3, 4, 5
INDENT: int | None = None  # set by main: 2 on a terminal, None (one line per object) when piped or --json


def as_json(message, indent: int | None = None) -> str:
    return json.dumps(json_format.MessageToDict(message, preserving_proto_field_name=True), sort_keys=True,
                      indent=indent)


def version_text() -> str:
    from openengine_adapters.launcher import distribution_version
    from openengine_adapters.launcher import version_text as releases

    return f"openengine {distribution_version('openengine-adapters') or 'unknown'}\n" + \
        "\n".join(releases("engine", None).splitlines()[2:])


def failure_line(target: str, exc: OpenEngineError) -> tuple[int, str]:
    """The one line and exit status for a refused or failed call."""
    detail = " ".join((exc.message or exc.status.name).split())
    if isinstance(exc, ServerUnreachable):
        tls = any(word in detail.lower() for word in ("ssl", "tls", "handshake", "certificate"))
        hint = ("the TLS handshake failed: check --tls/--tls-ca-file against the server's TLS setting"
                if tls else "is the server running there, and does it speak TLS (then add --tls-ca-file)?")
        return EXIT_UNREACHABLE, f"openengine: cannot reach {target}: {hint} ({detail})"
    if isinstance(exc, AuthenticationRefused):
        return EXIT_REFUSED, f"openengine: {target}: {exc.status.name}: {detail} (check --token)"
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND, f"openengine: {target}: NOT_FOUND: {detail}"
    return EXIT_FAILED, f"openengine: {target}: {exc.status.name}: {detail}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="openengine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=version_text(),
                   help="print this client's version and the schema releases it speaks, then exit")
    p.add_argument("--json", action="store_true", dest="compact",
                   help="compact JSON, one object a line (the default when the output is not a terminal)")
    p.add_argument("--target", default=os.environ.get("OPENENGINE_TARGET", DEFAULT_TARGET),
                   help=f"HOST:PORT of the server (default: $OPENENGINE_TARGET or {DEFAULT_TARGET})")
    p.add_argument("--contract", choices=("revision-1", "v0.1.0"), default="revision-1",
                   help="the surface to speak: revision 1 (openengine.v1.OpenEngine, default) or v0.1.0 "
                        "(openengine.v1.Inference + Control)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-call timeout in seconds (default 60)")
    add_client_args(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", help="the server's identity as JSON")
    sub.add_parser("models", help="every served model's ModelInfo as JSON")
    h = sub.add_parser("health", help="health state and checks")
    h.add_argument("--probe", action="store_true", help="run a minimal inference probe")
    ld = sub.add_parser("load", help="the engine's current load as JSON")
    ld.add_argument("--per-rank", action="store_true")
    gen = sub.add_parser("generate", help="stream a generation")
    gen.add_argument("prompt")
    gen.add_argument("--model", default="", help="model name (default: the server's default model)")
    gen.add_argument("--max-tokens", type=int, default=None)
    gen.add_argument("--temperature", type=float, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("-n", "--num-sequences", type=int, default=None, help="outputs to sample (text is labelled)")
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    gen.add_argument("--request-id", default="")
    gen.add_argument("--json", action="store_true", help="print every event as a JSON line instead of text")
    ab = sub.add_parser("abort", help="abort a request (or all: an operator action)")
    target = ab.add_mutually_exclusive_group(required=True)
    target.add_argument("request_id", nargs="?")
    target.add_argument("--all", action="store_true")
    kv = sub.add_parser("kv-events", help="tail KV cache events as JSON lines")
    kv.add_argument("--snapshot", action="store_true", help="start with the engine's current blocks")
    kv.add_argument("--rank", type=int, action="append", default=[], help="data-parallel rank (repeatable)")
    sub.add_parser("runtime-events", help="tail runtime events as JSON lines (revision 1)")
    return p


def generate_request(args) -> g.GenerateRequest:
    req = g.GenerateRequest(request_id=args.request_id, model=args.model, prompt=args.prompt)
    if args.max_tokens is not None:
        req.stopping.max_tokens = args.max_tokens
    for text in args.stop:
        req.stopping.conditions.add(stop_text=text)
    for name in ("temperature", "top_p", "seed", "num_sequences"):
        value = getattr(args, name)
        if value is not None:
            setattr(req.sampling, name, value)
    return req


def finish_text(finished: g.GenerationFinished) -> str:
    reason = g.FinishReason.Name(finished.reason).removeprefix("FINISH_REASON_") \
        if finished.reason in g.FinishReason.values() else str(finished.reason)
    match = finished.stop_match.WhichOneof("match")
    return reason + (f" ({match} {getattr(finished.stop_match, match)!r})" if match else "") + \
        (f": {finished.message}" if finished.message else "")


async def run_generate(client: OpenEngineClient, args, out: Callable[[str], None]) -> int:
    """Text as it arrives (outputs labelled when there are several), then why each output stopped and
    the usage, on stderr (stdout stays the text); a terminal error is exit 1."""
    req = generate_request(args)
    several = req.sampling.num_sequences > 1
    status = 0
    async for resp in client.generate(req, timeout=args.timeout):
        kind = resp.WhichOneof("event")
        if args.json:
            out(as_json(resp) + "\n")
        elif kind == "token":
            text = resp.token.text
            out(f"[{resp.token.output_index}] {text}\n" if several else text)
        elif kind == "finished":
            if not several:
                out("\n")
            label = f"[{resp.finished.output_index}] " if several else ""
            print(f"{label}finished: {finish_text(resp.finished)}", file=sys.stderr, flush=True)
        elif kind == "prefill_ready" and not args.json:
            print("prefill ready: KV session handed off", file=sys.stderr, flush=True)
        if kind == "error":
            if not args.json:
                code = error_pb2.ErrorCode.Name(resp.error.code) if resp.error.code in error_pb2.ErrorCode.values() \
                    else str(resp.error.code)
                print(f"\nerror: {code}: {resp.error.message}", file=sys.stderr)
            status = 1
        if resp.HasField("usage") and not args.json:
            u = resp.usage
            print(f"usage: {u.prompt_tokens} prompt + {u.completion_tokens} completion tokens", file=sys.stderr)
    return status


async def tail(stream, out: Callable[[str], None]) -> int:
    async for event in stream:
        out(as_json(event) + "\n")  # one event a line, also on a terminal: a tail is read line by line
        if event.WhichOneof("event") == "error":
            return 1
    return 0


async def run(args, out: Callable[[str], None]) -> int:
    try:
        client = OpenEngineClient(args.target, contract=args.contract, tls=args.tls, tls_ca_file=args.tls_ca_file,
                                  tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file, token=args.token)
    except (OSError, ValueError) as exc:  # an unreadable certificate file, a token gRPC cannot send
        print(f"openengine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        info = await client.connect(timeout=min(args.timeout, 10.0))
        cmd = args.command
        if cmd == "info":
            if args.contract == "v0.1.0":
                out(as_json(await client.stub.GetServerInfo(timeout=args.timeout), INDENT) + "\n")
            else:
                out(as_json(info, INDENT) + "\n")
        elif cmd == "models":
            for name in info.supported_models:
                out(as_json(await client.get_model_info(name), INDENT) + "\n")
        elif cmd == "health":
            resp = await client.health(include_inference_probe=args.probe)
            out(f"{HEALTH.get(resp.state, resp.state)}\n")
            for c in resp.checks:
                out(f"  {c.name}: {HEALTH.get(c.state, c.state)}{' - ' + c.message if c.message else ''}\n")
            return 0 if resp.state in (lifecycle_pb2.HEALTH_STATE_READY, lifecycle_pb2.HEALTH_STATE_DEGRADED) else 1
        elif cmd == "load":
            out(as_json(await client.get_load(args.per_rank), INDENT) + "\n")
        elif cmd == "generate":
            return await run_generate(client, args, out)
        elif cmd == "abort":
            resp = await (client.abort(all_requests=True) if args.all else client.abort(args.request_id))
            out(f"{lifecycle_pb2.AbortStatus.Name(resp.status).removeprefix('ABORT_STATUS_').lower()}"
                f"{': ' + resp.message if resp.message else ''}\n")
        elif cmd == "kv-events":
            return await tail(client.subscribe_kv_events(args.rank, include_snapshot=args.snapshot), out)
        elif cmd == "runtime-events":
            return await tail(client.subscribe_runtime_events(), out)
        return 0
    except grpc.aio.AioRpcError as exc:
        status, line = failure_line(args.target, typed_error(exc))
        print(line, file=sys.stderr)
        return status
    except (IncompatibleServer, NotOnSurface) as exc:
        print(f"openengine: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    global INDENT
    args = build_parser().parse_args(argv)
    INDENT = 2 if sys.stdout.isatty() and not args.compact else None

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()  # streamed text shows as it arrives

    try:
        return asyncio.run(run(args, out))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `openengine kv-events | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
