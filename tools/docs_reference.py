"""The documentation's command-line reference, generated from the argparse definitions themselves.

An MkDocs hook (mkdocs.yml ``hooks``): a page line ``<!-- reference:NAME -->`` is replaced with the
tables of the parser NAME (see ``PARSERS``) at every build, so the reference cannot drift from the
code; ``<!-- reference:layers -->`` with the package's floors from tools/import_graph.py. No engine is
imported: each adapter's own flags are added by its ``add_adapter_args``.
``python tools/docs_reference.py NAME`` prints one.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MARK = re.compile(r"^<!-- reference:([\w-]+) -->$", re.M)


def _server() -> argparse.ArgumentParser:
    from openengine_adapters.server_config import add_server_args

    p = argparse.ArgumentParser(prog="python -m openengine_adapters.<engine>", add_help=False)
    add_server_args(p)
    return p


def _adapter(engine: str):
    def build() -> argparse.ArgumentParser:
        import importlib

        module = importlib.import_module(f"openengine_adapters.{engine}.__main__")
        p = argparse.ArgumentParser(prog=module.PROG, add_help=False)
        module.add_adapter_args(p)
        return p
    return build


def _trtllm() -> argparse.ArgumentParser:
    from openengine_adapters.trtllm.__main__ import build_parser

    return build_parser()


def _cli() -> argparse.ArgumentParser:
    from openengine_adapters.cli import build_parser

    return build_parser()


def _conformance() -> argparse.ArgumentParser:
    from conformance.__main__ import build_parser

    return build_parser()


PARSERS = {"server": _server, "vllm": _adapter("vllm"), "sglang": _adapter("sglang"), "trtllm": _trtllm,
           "cli": _cli, "conformance": _conformance}
OURS = ("OpenEngine server", "OpenEngine security")  # in every launcher: listed once, under "server"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def default_of(action: argparse.Action) -> str:
    """The default as a user reads it: switches say off/on, an absent value says nothing."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if action.default else "off"
    if action.nargs == 0:  # store_true / store_false / version / help
        return ""
    if action.default in (None, "", [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def flag_names(action: argparse.Action) -> str:
    names = action.option_strings or [action.metavar or action.dest]
    value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    if action.choices and action.nargs != 0:
        value = " {" + ",".join(map(str, action.choices)) + "}"
    return ", ".join(f"`{n}{value if n == names[-1] and action.option_strings else ''}`" for n in names)


def table(actions: list[argparse.Action]) -> list[str]:
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for a in actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
            continue
        help_text = (a.help or "") % {"default": a.default, "prog": ""} if a.help and "%(" in a.help else (a.help or "")
        rows.append(f"| {flag_names(a)} | {default_of(a)} | {_cell(help_text)} |")
    return rows


def render(name: str, skip_groups: tuple[str, ...] = ()) -> str:
    import os
    from unittest import mock

    # defaults read from the environment (a token, a target) are the builder's, not the reader's
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENENGINE_")}
    with mock.patch.dict(os.environ, clean, clear=True):
        parser = PARSERS[name]()
    out: list[str] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._SubParsersAction)]
        if not actions or group.title in skip_groups:
            continue
        if len(parser._action_groups) > 1:
            out += [f"**{group.title}**", ""]
        out += table(actions) + [""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for command, sub in action.choices.items():
                out += [f"### `{parser.prog} {command}`", "", _cell(helps.get(command, "")), ""]
                actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
                out += (table(actions) if actions else ["(no options)"]) + [""]
    return "\n".join(out).rstrip() + "\n"


def layers() -> str:
    """The package's floors as tools/import_graph.py checks them (lint fails on an import that goes up),
    highest first: a picture and a table, so the page cannot drift from the rule CI enforces."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_graph", Path(__file__).with_name("import_graph.py"))
    graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph)
    floors = list(enumerate(graph.FLOORS["openengine_adapters"]))[::-1]
    out = ["```mermaid", "flowchart TB"]
    for level, (rooms, purpose) in floors:
        names = ", ".join(r.replace("<package>", "__init__") for r in rooms)
        out.append(f'  F{level}["<b>{purpose}</b><br/>{names}"]')
    out += [f"  F{a} --> F{b}" for (a, _), (b, _) in zip(floors, floors[1:], strict=False)]
    out += ["```", "", "| floor | rooms (`openengine_adapters/...`) | what it is |", "|---|---|---|"]
    for level, (rooms, purpose) in floors:
        out.append(f"| {level} | {', '.join(f'`{r}`' for r in rooms)} | {_cell(purpose)} |")
    return "\n".join(out) + "\n"


def expand(name: str) -> str:
    return layers() if name == "layers" else render(name, OURS if name == "trtllm" else ())


def on_page_markdown(markdown: str, page=None, config=None, files=None) -> str:
    """MkDocs hook: expand every reference marker on the page."""
    return MARK.sub(lambda m: expand(m.group(1)), markdown)


if __name__ == "__main__":
    print(expand(sys.argv[1]))
