"""Check results: a table a person can read and a JSON document a machine can."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

PASS, FAIL, SKIP = "pass", "fail", "skip"
NOT_ADVERTISED = "not advertised by this target (its refusal is checked elsewhere) or not observable here"


def enabler(reason: str) -> str:
    """What would make a skipped check run: a flag, another contract, another role, or nothing (a feature
    the target does not advertise, whose refusal other checks verify)."""
    flag = re.search(r"no (--[a-z-]+)", reason)
    if flag:
        return f"{flag.group(1)} (opt-in engine hook or expectation)"
    if reason.startswith("destructive"):
        return "--destructive (changes server state: Abort(all), Drain)"
    if "v0.1.0 only" in reason:
        return "--contract v0.1.0 (or both)"
    if "not part of the v0.1.0 contract" in reason:
        return "--contract revision-1 (or both)"
    role = re.search(r"role (\w+) is not (PREFILL|DECODE)|role (PREFILL|DECODE) (does|needs)", reason)
    if role:
        return f"a target serving role {role.group(2) or 'AGGREGATED'}"
    if "advertises generation" in reason or "no generation capabilities" in reason:
        return "a target whose model has generation (or, for task-only checks, one without)"
    if "long request finished" in reason:
        return "--long-request-metadata (slow a test engine so long requests stay running)"
    return NOT_ADVERTISED


@dataclass
class Result:
    name: str
    domain: str
    status: str
    reason: str = ""
    requires: str = ""
    destructive: bool = False
    duration_s: float = 0.0


@dataclass
class Report:
    target: str
    model: str = ""
    engine: dict = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    # why the target could not be examined at all (unreachable, refused the identity call): no check ran
    setup_error: str | None = None

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def passed(self) -> int:
        return self.count(PASS)

    @property
    def failed(self) -> int:
        return self.count(FAIL)

    @property
    def skipped(self) -> int:
        return self.count(SKIP)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status == FAIL]

    def get(self, name: str) -> Result | None:
        return next((r for r in self.results if r.name == name), None)

    def skips_by_enabler(self) -> dict[str, list[str]]:
        """Skipped checks grouped by what would run them (``enabler``)."""
        out: dict[str, list[str]] = {}
        for r in self.results:
            if r.status == SKIP:
                out.setdefault(enabler(r.reason), []).append(r.name)
        return out

    def to_dict(self) -> dict:
        return {
            "target": self.target, "model": self.model, "engine": self.engine,
            "summary": {"passed": self.passed, "failed": self.failed, "skipped": self.skipped,
                        "total": len(self.results), "ok": self.ok},
            "skipped_by_enabler": self.skips_by_enabler(),
            "results": [asdict(r) for r in self.results],
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=2)
            fh.write("\n")

    def table(self, width: int = 120) -> str:
        name_w = max([len("check")] + [len(r.name) for r in self.results])
        lines = [f"OpenEngine conformance: {self.target}  model={self.model!r}  "
                 + "  ".join(f"{k}={v}" for k, v in self.engine.items()), ""]
        lines.append(f"{'check'.ljust(name_w)}  {'result':6}  detail")
        lines.append(f"{'-' * name_w}  ------  {'-' * 30}")
        room = max(20, width - name_w - 10)
        for r in self.results:
            detail = r.reason if r.status != PASS else ""
            if r.status == SKIP:
                detail = f"skipped: {r.reason}"
            detail = detail.replace("\n", " ")
            if len(detail) > room and r.status != FAIL:
                detail = detail[: room - 3] + "..."
            lines.append(f"{r.name.ljust(name_w)}  {r.status.upper():6}  {detail}".rstrip())
        groups = self.skips_by_enabler()
        if groups:
            lines.append("")
            lines.append("Skipped checks, by what would run them:")
            for how, names in sorted(groups.items(), key=lambda kv: kv[0] == NOT_ADVERTISED):
                lines.append(f"  {how}: {len(names)}")
                lines.append("    " + ", ".join(names))
        lines.append("")
        lines.append(f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped "
                     f"({len(self.results)} checks)")
        return "\n".join(lines)
