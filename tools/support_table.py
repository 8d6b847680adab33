"""Print the documentation's support table (docs/support.md) from adapters/*/manifest.json (a unit test
keeps them equal).

Usage: python tools/support_table.py [--write]
"""

from __future__ import annotations

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- support-table:begin -->", "<!-- support-table:end -->"
MARK = {"supported": "yes", "conditional": "when configured", "rejected": "no"}


def manifests() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(ROOT.glob("adapters/*/manifest.json"))]


def render() -> str:
    lines = [BEGIN]
    for m in manifests():
        lines += [f"**{m['engine']}** ({m['package']} {m['tested_versions']}; tested on {m['tested_on']})", "",
                  "| feature | status | detail |", "|---|---|---|"]
        for f in m["features"]:
            detail = "; ".join(x for x in (
                f.get("condition", ""),
                f"otherwise {f['grpc_status']}" if f["status"] == "conditional" and f.get("grpc_status") else "",
                f"{f['grpc_status']}" if f["status"] == "rejected" and f.get("grpc_status") else "",
                f.get("note", "")) if x)
            lines.append(f"| `{f['key']}` | {MARK[f['status']]} | {detail} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


PAGE = ROOT / "docs" / "support.md"


def write_page(page: pathlib.Path = PAGE) -> None:
    """Replace the table between the markers in place."""
    text = page.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    page.write_text(text[:start] + render() + text[end:])


if __name__ == "__main__":
    import sys

    if "--write" in sys.argv:
        write_page()
    else:
        print(render())
