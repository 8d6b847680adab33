"""``openengine``: a command-line client for any OpenEngine server, on the typed client.

    openengine [--target HOST:PORT] [--contract revision-1|v0.1.0] [TLS/token options] COMMAND ...

    info                      the server's identity (EngineInfo / ServerInfo) as JSON
    models                    each served model's ModelInfo as JSON
    health [--probe]          health state and checks (with --probe: a minimal inference)
    load [--per-rank]         the engine's current load
    generate PROMPT           stream text as it arrives (--json: every event as a JSON line)
    abort REQUEST_ID | --all  abort one request, or every request (an operator action)
    kv-events                 tail KV cache events as JSON lines (Ctrl-C to stop)
    runtime-events            tail runtime events as JSON lines (revision 1 only)

``--target`` defaults to ``$OPENENGINE_TARGET`` or ``localhost:50051``; ``--token`` to
``$OPENENGINE_API_KEY``. The exit status is 0 on success, 1 when the server refuses or fails the
call (its status and message are printed on stderr), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable

import grpc
from google.protobuf import json_format

from openengine_adapters.client import IncompatibleServer, NotOnSurface, OpenEngineClient
from openengine_adapters.security.channel import add_client_args
from openengine_adapters.v1 import error_pb2, lifecycle_pb2
from openengine_adapters.v1 import generation_pb2 as g

DEFAULT_TARGET = "localhost:50051"
HEALTH = {v: k.removeprefix("HEALTH_STATE_").lower() for k, v in lifecycle_pb2.HealthState.items()}


def as_json(message) -> str:
    return json.dumps(json_format.MessageToDict(message, preserving_proto_field_name=True), sort_keys=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="openengine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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


async def run_generate(client: OpenEngineClient, args, out: Callable[[str], None]) -> int:
    """Text as it arrives (outputs labelled when there are several); a terminal error is exit 1."""
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
        elif kind == "finished" and not several and resp.HasField("usage"):
            out("\n")
        if kind == "error":
            if not args.json:
                code = error_pb2.ErrorCode.Name(resp.error.code) if resp.error.code in error_pb2.ErrorCode.values() \
                    else str(resp.error.code)
                print(f"\nerror: {code}: {resp.error.message}", file=sys.stderr)
            status = 1
        if resp.HasField("usage") and not args.json:
            u = resp.usage
            print(f"[{u.prompt_tokens} prompt + {u.completion_tokens} completion tokens]", file=sys.stderr)
    return status


async def tail(stream, out: Callable[[str], None]) -> int:
    async for event in stream:
        out(as_json(event) + "\n")
        if event.WhichOneof("event") == "error":
            return 1
    return 0


async def run(args, out: Callable[[str], None]) -> int:
    client = OpenEngineClient(args.target, contract=args.contract, tls=args.tls, tls_ca_file=args.tls_ca_file,
                              tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file, token=args.token)
    try:
        info = await client.connect(timeout=min(args.timeout, 10.0))
        cmd = args.command
        if cmd == "info":
            if args.contract == "v0.1.0":
                out(as_json(await client.stub.GetServerInfo(timeout=args.timeout)) + "\n")
            else:
                out(as_json(info) + "\n")
        elif cmd == "models":
            for name in info.supported_models:
                out(as_json(await client.get_model_info(name)) + "\n")
        elif cmd == "health":
            resp = await client.health(include_inference_probe=args.probe)
            out(f"{HEALTH.get(resp.state, resp.state)}\n")
            for c in resp.checks:
                out(f"  {c.name}: {HEALTH.get(c.state, c.state)}{' - ' + c.message if c.message else ''}\n")
            return 0 if resp.state in (lifecycle_pb2.HEALTH_STATE_READY, lifecycle_pb2.HEALTH_STATE_DEGRADED) else 1
        elif cmd == "load":
            out(as_json(await client.get_load(args.per_rank)) + "\n")
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
        print(f"openengine: {args.target}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except (IncompatibleServer, NotOnSurface) as exc:
        print(f"openengine: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

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
