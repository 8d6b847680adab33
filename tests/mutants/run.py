"""Mutation testing of the conformance suite: serve each mutant of tests/mutants/catalog.py, run the suite
against it, print the mutation score and the survivors.

    python tests/mutants/run.py [--only GLOBS] [--smoke] [--no-hooks] [--jobs 2] [--json FILE] [--min-score 0.9]

Each mutant is served by its own fake-engine server process (``serve_mutant.py``) and checked with
``python -m conformance --contract both --destructive`` plus the opt-in flags the fake supports (long,
failing and serialized requests, an admission limit, a loadable LoRA directory). A mutant is KILLED
when at least one check fails; the unmutated server of every target must pass first (else the run
stops: a score against a failing baseline would mean nothing). ``--smoke`` runs only the mutants
marked ``smoke`` with the checks named there (the unit suite's subset). ``--no-hooks`` runs the suite as
a user runs it against a real engine, without the fake's failure and serialization hooks; a mutant whose
``needs`` names one of those is then an expected survivor. Exit status: 0 when the score reaches
``--min-score`` and every survivor is one the catalog expects (``invisible``), else 1.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from catalog import MUTANTS, Mutant  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE.parent)])}
ADMISSION_LIMIT = 4


# the fake engine's behaviour hooks: a real engine has no way to be told to fail or to run one at a time
HOOKS = {"--fail-request-metadata": "fake.crash_after=2", "--serial-request-metadata": "fake.serialize=1"}


def suite_flags(lora_dir: str, hooks: bool = True) -> list[str]:
    """The conformance flags of a mutation run: every opt-in flag the fake engine serves, its behaviour
    hooks only with ``hooks`` (``$MUTATION_SUITE_FLAGS``, a JSON list, replaces them: e.g. to score an
    older suite)."""
    if os.environ.get("MUTATION_SUITE_FLAGS"):
        return json.loads(os.environ["MUTATION_SUITE_FLAGS"])
    flags = ["--contract", "both", "--destructive", "--timeout", "20",
             "--expect-admission-limit", str(ADMISSION_LIMIT),
             "--long-request-metadata", "fake.step_delay_ms=50",
             "--lora-dir", lora_dir]
    for flag, value in HOOKS.items() if hooks else ():
        flags += [flag, value]
    return flags


def lora_directory() -> str:
    """A directory the fake engine loads as a LoRA adapter (it holds an adapter_config.json)."""
    path = Path(tempfile.mkdtemp(prefix="oe-mutation-lora-"))
    (path / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}\n')
    return str(path)


@dataclass
class Outcome:
    name: str
    killed: bool
    failed_checks: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


def _serve(mutant: str, target: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "serve_mutant.py"), "--mutant", mutant, "--target", target,
                             "--host", "127.0.0.1", "--port", "0", "--advertise-host", "127.0.0.1",
                             "--drain-grace-s", "1", "--max-in-flight", str(ADMISSION_LIMIT)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, text=True, cwd=ROOT)
    line = proc.stdout.readline()
    m = re.search(r"ready on .*:(\d+)", line)
    if not m:
        rest = proc.stdout.read() if proc.poll() is not None else ""
        proc.kill()
        raise RuntimeError(f"server for {mutant} did not start: {line}{rest[-2000:]}")
    return proc, f"127.0.0.1:{m.group(1)}"


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    proc.stdout.close()


def run_one(mutant: str, target: str, flags: list[str], only: str | None = None) -> Outcome:
    """Serve ``mutant`` (or ``none``) on ``target`` and run the suite; killed = any check failed."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        try:
            proc, address = _serve(mutant, target)
        except RuntimeError as exc:
            return Outcome(mutant, False, error=str(exc), seconds=time.monotonic() - start)
        try:
            cmd = [sys.executable, "-m", "conformance", "--target", address, "--json", str(report), "-q", *flags]
            if only:
                cmd += ["--only", only]
            run = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
        except subprocess.TimeoutExpired:
            return Outcome(mutant, True, ["(the suite timed out)"], seconds=time.monotonic() - start)
        finally:
            _stop(proc)
        if not report.exists():
            if run.returncode == 2 and "cannot examine" in run.stderr:  # the suite refused the target outright
                return Outcome(mutant, True, [run.stderr.strip()[-300:]], seconds=time.monotonic() - start)
            return Outcome(mutant, False, error=f"no report: {run.stdout[-1000:]}{run.stderr[-2000:]}",
                           seconds=time.monotonic() - start)
        data = json.loads(report.read_text())
    reports = data.get("reports", [data])
    failed = [f"{r['engine'].get('contract', '?')}:{x['name']}" for r in reports for x in r["results"]
              if x["status"] == "fail"]
    return Outcome(mutant, bool(failed), failed, seconds=time.monotonic() - start)


def run_mutants(mutants: list[Mutant], jobs: int = 2, smoke: bool = False,
                progress=functools.partial(print, flush=True), hooks: bool = True) -> dict:
    lora_dir = lora_directory()
    flags = suite_flags(lora_dir, hooks)
    targets = sorted({m.target for m in mutants})
    only = ",".join(sorted({m.smoke for m in mutants})) if smoke else None
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        baselines = dict(zip(targets, pool.map(lambda t: run_one("none", t, flags, only), targets), strict=True))
        for target, b in baselines.items():
            if b.error or b.failed_checks:
                raise SystemExit(f"the unmutated {target} server fails the suite ({b.error or b.failed_checks}): "
                                 "fix the suite or the fake before scoring mutants")
        outcomes = list(pool.map(lambda m: _scored(m, flags, smoke, progress), mutants))
    return summarize(mutants, outcomes, hooks)


def _scored(m: Mutant, flags: list[str], smoke: bool, progress) -> Outcome:
    out = run_one(m.name, m.target, flags, only=m.smoke if smoke else None)
    if progress is not None:
        verdict = "ERROR" if out.error else ("killed" if out.killed else "SURVIVED")
        detail = ", ".join(out.failed_checks[:3]) or out.error[:200]
        progress(f"  {verdict:8} {m.name:45} {out.seconds:5.1f}s  {detail}")
    return out


def expected_survival(m: Mutant, hooks: bool = True) -> str:
    """Why ``m`` may survive this run ("" = it must be killed)."""
    if m.invisible:
        return m.invisible
    if m.needs and not hooks and m.needs in HOOKS:
        return f"seen only with {m.needs} (a test-engine hook; see docs/conformance.md)"
    return ""


def summarize(mutants: list[Mutant], outcomes: list[Outcome], hooks: bool = True) -> dict:
    by_name = {m.name: m for m in mutants}
    valid = [o for o in outcomes if not o.error]
    killed = [o for o in valid if o.killed]
    survivors = [o for o in valid if not o.killed]
    return {
        "mutants": len(mutants), "scored": len(valid), "killed": len(killed),
        "score": round(len(killed) / len(valid), 4) if valid else 0.0,
        "errors": [{"name": o.name, "error": o.error} for o in outcomes if o.error],
        "survivors": [{"name": o.name, "rule": by_name[o.name].rule,
                       "invisible": expected_survival(by_name[o.name], hooks)}
                      for o in survivors],
        "results": [{"name": o.name, "target": by_name[o.name].target, "killed": o.killed,
                     "failed_checks": o.failed_checks, "error": o.error, "seconds": round(o.seconds, 1)}
                    for o in outcomes],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/mutants/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma-separated globs of mutant names")
    p.add_argument("--smoke", action="store_true", help="only the smoke subset, each with its named checks")
    p.add_argument("--no-hooks", action="store_true",
                   help="run the suite as a user does: without the fake engine's failure and serialization hooks")
    p.add_argument("--jobs", type=int, default=2, help="mutants served and checked at once (default 2)")
    p.add_argument("--json", metavar="FILE", help="write the outcome here")
    p.add_argument("--min-score", type=float, default=0.9, help="fail below this killed fraction (default 0.9)")
    p.add_argument("--list", action="store_true", help="list the mutants and the rule each breaks")
    args = p.parse_args(argv)
    mutants = list(MUTANTS.values())
    if args.smoke:
        mutants = [m for m in mutants if m.smoke]
    if args.only:
        pats = [x.strip() for x in args.only.split(",") if x.strip()]
        mutants = [m for m in mutants if any(fnmatch.fnmatchcase(m.name, x) or x in m.name for x in pats)]
    if args.list:
        for m in mutants:
            print(f"{m.name:45} [{m.target}] {m.rule}")
        return 0
    print(f"mutation testing: {len(mutants)} mutants, {args.jobs} at a time"
          + (" (no test-engine hooks)" if args.no_hooks else ""), flush=True)
    result = run_mutants(mutants, args.jobs, args.smoke, hooks=not args.no_hooks)
    print()
    print(f"mutation score: {result['killed']}/{result['scored']} killed = {result['score']:.1%}")
    for s in result["survivors"]:
        why = s["invisible"] or "NOT EXPECTED: the suite should see this violation"
        print(f"  survivor {s['name']}: {s['rule']}\n           why: {why}")
    for e in result["errors"]:
        print(f"  ERROR {e['name']}: {e['error'][:500]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    unexpected = [s for s in result["survivors"] if not s["invisible"]]
    ok = result["score"] >= args.min_score and not unexpected and not result["errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
