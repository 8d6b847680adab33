"""Check results: a table a person can read and a JSON document a machine can."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

PASS, FAIL, SKIP = "pass", "fail", "skip"


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

    def to_dict(self) -> dict:
        return {
            "target": self.target, "model": self.model, "engine": self.engine,
            "summary": {"passed": self.passed, "failed": self.failed, "skipped": self.skipped,
                        "total": len(self.results), "ok": self.ok},
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
        lines.append("")
        lines.append(f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped "
                     f"({len(self.results)} checks)")
        return "\n".join(lines)
