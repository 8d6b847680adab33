"""tools/import_graph.py (run by the lint session) finds each kind of breach on a small tree of its own."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def graph(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "KNOWN", {})
    monkeypatch.setattr(module, "KNOWN_PRIVATE", {})

    def tree(files: dict[str, str]) -> list[str]:
        for name in ("openengine_adapters/__init__.py", "conformance/__init__.py", *files):
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files.get(name, ""))
        return module.breaches()

    tree.module = module
    return tree


def test_the_repository_keeps_the_rules():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.breaches() == []


def test_a_clean_tree_passes(graph):
    assert graph({"openengine_adapters/core/service.py": "from openengine_adapters import errors\n",
                  "openengine_adapters/errors.py": "from openengine_adapters.types import X\n",
                  "openengine_adapters/types.py": ""}) == []


def test_an_upward_import_fails_even_when_lazy(graph):
    problems = graph({"openengine_adapters/validation/tasks.py": "def f():\n    from ..core import catalog\n",
                      "openengine_adapters/core/catalog.py": ""})
    assert problems == ["openengine_adapters/validation/tasks.py:2: upward import of openengine_adapters.core.catalog"]


def test_a_cycle_on_one_floor_fails(graph):
    problems = graph({"openengine_adapters/wire/a.py": "from openengine_adapters.security import b\n",
                      "openengine_adapters/security/b.py": "import openengine_adapters.wire.a\n"})
    assert problems == ["import cycle: openengine_adapters.security.b -> openengine_adapters.wire.a"]


def test_a_private_name_used_from_another_module_fails(graph):
    problems = graph({"conformance/checks/tasks.py": "def _cap(): pass\n",
                      "conformance/checks/lifecycle.py": "from conformance.checks import tasks\ntasks._cap()\n",
                      "conformance/checks/kv.py": "from conformance.checks.tasks import _cap\n"})
    assert sorted(problems) == ["conformance/checks/kv.py:1: imports conformance.checks.tasks's private _cap",
                                "conformance/checks/lifecycle.py:2: uses the private conformance.checks.tasks._cap"]


def test_a_room_on_no_floor_and_a_stale_allowance_fail(graph, monkeypatch):
    monkeypatch.setattr(graph.module, "KNOWN", {("openengine_adapters.core.x", "openengine_adapters.server"): "old"})
    problems = graph({"openengine_adapters/newroom.py": ""})
    assert "openengine_adapters/newroom.py: its room is on no floor of FLOORS (tools/import_graph.py)" in problems
    assert any("which is gone: remove the line" in p for p in problems)
