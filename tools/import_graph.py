"""The import rules of DESIGN.md, checked on the source (the lint session runs this; exit 1 on a breach).

Three rules, read from every import statement, lazy ones inside functions included (they are still a
dependency; laziness only changes when it is paid):
1. no import cycle between modules;
2. no upward import: each top-level room of a package sits on one floor of ``FLOORS`` and imports
   only from its own floor or those below (generated stubs, ``v1`` and ``v0_1``, are the ground);
3. no module imports another module's private (``_name``) name.

What the code did before these rules were checked is listed in ``KNOWN`` with the issue that removes
it. A listed breach that is gone fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("openengine_adapters", "conformance")
GENERATED = ("openengine_adapters.v1", "openengine_adapters.v0_1")

# Lowest first: (rooms, what the floor is). A room is the first name below the package (a module or a
# sub-package). docs/architecture.md draws these floors (tools/docs_reference.py, ``reference:layers``).
FLOORS: dict[str, list[tuple[list[str], str]]] = {
    "openengine_adapters": [
        (["<package>", "types", "schema", "v1", "v0_1", "metrics"], "contract data, no rules"),
        (["torch_extensions", "engine_processes"], "what engine processes do first and how they end"),
        (["backend", "errors", "sampling", "event_hub", "messages", "rerank"], "the seam"),
        (["validation", "kv_events", "engine_kit"], "rules and what engines share"),
        (["core"], "the engine-agnostic service"),
        (["wire", "security"], "the surfaces and what guards them"),
        (["server", "server_config", "tracing"], "serving: the server, its settings and its interceptors"),
        (["launcher", "client", "cli"], "entry points"),
        (["vllm", "sglang", "trtllm", "demo_model"], "engines and the demo model they serve"),
    ],
    "conformance": [
        (["registry", "report"], "what a check is and how results are told"),
        (["context"], "the connection a check runs on"),
        (["checks"], "the checks"),
        (["runner"], "running them"),
        (["pytest_plugin", "__main__", "<package>"], "entry points"),
    ],
}

# (importer, imported) -> why it is still here. Remove a line with the breach it names.
KNOWN: dict[tuple[str, str], str] = {
}
KNOWN_PRIVATE: dict[tuple[str, str], str] = {
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = module_name(path)
            if not name.startswith(GENERATED):
                found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every in-project import of one module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield (sub, None, node.lineno) if sub in known else (source, alias.name, node.lineno)


def private_uses(path: Path, known: dict[str, Path], name: str) -> Iterator[tuple[str, int]]:
    """``module._name`` for every in-project module this file binds to a name (``from pkg import mod``,
    ``import pkg.mod as mod``)."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}
    for target, imported, _ in imports(name, path, known):
        if imported is None and target in known:
            bound[target.rpartition(".")[2]] = target
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in known:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            yield f"{bound[node.value.id]}.{node.attr}", node.lineno


def resolve(target: str, known: dict[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def floor_of(module: str) -> tuple[str, int] | None:
    package, _, rest = module.partition(".")
    room = rest.split(".")[0] if rest else "<package>"
    for level, (rooms, _) in enumerate(FLOORS[package]):
        if room in rooms:
            return package, level
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def breaches() -> list[str]:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    problems: list[str] = []
    upward: set[tuple[str, str]] = set()
    private: set[tuple[str, str]] = set()
    for name, path in known.items():
        where = floor_of(name)
        if where is None:
            problems.append(f"{path.relative_to(ROOT)}: its room is on no floor of FLOORS (tools/import_graph.py)")
            continue
        for target, imported, line in imports(name, path, known):
            module = resolve(target, known)
            if module is None or module == name or module.startswith(GENERATED) and name.startswith(GENERATED):
                continue
            if module.startswith(GENERATED):
                continue
            graph[name].add(module)
            there = floor_of(module)
            if there and there[0] == where[0] and there[1] > where[1] and not name.startswith(module + "."):
                upward.add((name, module))
                if (name, module) not in KNOWN:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: upward import of {module}")
            if imported and imported.startswith("_") and not imported.startswith("__"):
                private.add((name, f"{module}.{imported}"))
                if (name, f"{module}.{imported}") not in KNOWN_PRIVATE:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: imports {module}'s private {imported}")
        for used, line in private_uses(path, known, name):
            if not used.startswith(name + "."):
                private.add((name, used))
                if (name, used) not in KNOWN_PRIVATE:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: uses the private {used}")
    for importer, imported in KNOWN:
        graph.get(importer, set()).discard(imported)  # reported above; a cycle must stand without them
    for component in cycles(graph):
        problems.append("import cycle: " + " -> ".join(component))
    for pair, why in {**KNOWN, **KNOWN_PRIVATE}.items():
        if pair not in upward | private:
            problems.append(f"KNOWN lists {pair[0]} -> {pair[1]} ({why}), which is gone: remove the line")
    return problems


def main() -> int:
    problems = breaches()
    for line in problems:
        print(line)
    print(f"import graph: {len(problems)} breach(es); {len(KNOWN) + len(KNOWN_PRIVATE)} known, awaiting issue 26")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
