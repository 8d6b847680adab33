"""``python -m conformance --target HOST:PORT [--contract revision-1|v0.1.0|both] [--model NAME] [--destructive]
[--json FILE] [--only PATTERN] [--tls-ca-file CA [--tls-cert-file CERT --tls-key-file KEY]] [--token KEY]``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from conformance.runner import run_suite_async
from openengine_adapters.security.channel import add_client_args


def parse_metadata(items: list[str], flag: str = "--long-request-metadata") -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} wants KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m conformance", description=__doc__)
    p.add_argument("--target", help="HOST:PORT of the OpenEngine gRPC server")
    p.add_argument("--contract", choices=("revision-1", "v0.1.0", "both"), default="revision-1",
                   help="the surface to test: revision 1 (openengine.v1.OpenEngine), upstream v0.1.0 "
                        "(openengine.v1.Inference + Control; RPCs it lacks are skipped), or both in turn")
    p.add_argument("--model", default=None, help="model to test (default: the first supported model)")
    p.add_argument("--destructive", action="store_true",
                   help="also run checks that change server state (Abort(all_requests), Drain)")
    p.add_argument("--json", metavar="FILE", help="write the machine-readable report here")
    p.add_argument("--only", metavar="PATTERN", help="comma-separated globs or substrings of check names")
    p.add_argument("--expect-admission-limit", type=int, metavar="N", default=None,
                   help="the target admits N requests at once: N+1 long streams must give RESOURCE_EXHAUSTED")
    p.add_argument("--long-request-metadata", action="append", default=[], metavar="KEY=VALUE",
                   help="metadata attached to requests that must stay running (e.g. to slow a test engine)")
    hooks = p.add_argument_group("opt-in engine hooks (test engines; each enables checks a plain run skips)")
    hooks.add_argument("--fail-request-metadata", action="append", default=[], metavar="KEY=VALUE",
                       help="metadata that makes the engine fail an accepted request mid-stream "
                            "(the fake: fake.crash_after=2)")
    hooks.add_argument("--serial-request-metadata", action="append", default=[], metavar="KEY=VALUE",
                       help="metadata that makes the engine run the requests carrying it one at a time, by "
                            "priority (the fake: fake.serialize=1)")
    hooks.add_argument("--lora-dir", metavar="DIR", default=None,
                       help="an absolute directory the target can load as a LoRA adapter")
    p.add_argument("--timeout", type=float, default=60.0, help="per-call timeout in seconds (default 60)")
    add_client_args(p, "; destructive checks need an operator's (admin) key where the server has one")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary line and failures")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    if args.list:
        from conformance.checks import all_checks

        for c in all_checks():
            print(f"{c.name:45} {'[destructive] ' if c.destructive else ''}{c.requires}", flush=True)
        return 0
    if not args.target:
        build_parser().error("--target is required")

    # both: v0.1.0 first, since revision 1's destructive Drain check leaves the server refusing work
    contracts = ("v0.1.0", "revision-1") if args.contract == "both" else (args.contract,)
    reports = []
    for contract in contracts:
        report = asyncio.run(run_suite_async(
            args.target, args.model, args.destructive, only=args.only,
            expect_admission_limit=args.expect_admission_limit,
            long_metadata=parse_metadata(args.long_request_metadata), check_timeout_s=args.timeout,
            contract=contract, tls=args.tls, tls_ca_file=args.tls_ca_file, tls_cert_file=args.tls_cert_file,
            tls_key_file=args.tls_key_file, token=args.token,
            fail_metadata=parse_metadata(args.fail_request_metadata, "--fail-request-metadata"),
            serial_metadata=parse_metadata(args.serial_request_metadata, "--serial-request-metadata"),
            lora_dir=args.lora_dir, progress=None if args.quiet else show_progress(contract)))
        if report.setup_error:
            print(f"conformance: cannot examine {args.target} ({contract}): {report.setup_error}", file=sys.stderr)
            return 2
        reports.append(report)
        if args.quiet:
            for r in report.failures():
                print(f"FAIL [{contract}] {r.name}: {r.reason}")
            print(f"{contract}: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
        else:
            print(report.table())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            data = reports[0].to_dict() if len(reports) == 1 else {"reports": [r.to_dict() for r in reports]}
            json.dump(data, fh, indent=2)
            fh.write("\n")
    return 0 if all(r.ok for r in reports) else 1


def show_progress(contract: str):
    """One line per check on stderr as it finishes, so a long run shows where it is."""
    def progress(result) -> None:
        print(f"  [{contract}] {result.status.upper():4} {result.name} ({result.duration_s:.1f} s)", file=sys.stderr,
              flush=True)
    return progress


def entry() -> int:
    """The console script: ``main`` with a closed pipe (``--list | head``) ending quietly."""
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(entry())
