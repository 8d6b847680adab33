"""Adapter manifests are well formed and the documentation's support table (docs/support.md) is generated
from them."""

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
STATUSES = {"supported", "conditional", "rejected"}
GRPC = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNIMPLEMENTED", "NOT_FOUND"}


def load_tool():
    spec = importlib.util.spec_from_file_location("support_table", ROOT / "tools" / "support_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(ROOT.glob("adapters/*/manifest.json")), ids=lambda p: p.parent.name)
def test_manifest_shape(path):
    m = json.loads(path.read_text())
    assert m["engine"] == path.parent.name and m["tested_versions"] and m["package"]
    keys = [f["key"] for f in m["features"]]
    assert len(keys) == len(set(keys)), "duplicate feature keys"
    for f in m["features"]:
        assert f["status"] in STATUSES, f
        if f["status"] == "rejected":
            assert f.get("grpc_status") in GRPC, f"{f['key']}: a rejected feature names its status"
        if f["status"] == "conditional":
            assert f.get("condition"), f"{f['key']}: a conditional feature names its condition"
        if "grpc_status" in f:
            assert f["grpc_status"] in GRPC


def test_docs_support_table_is_generated_from_manifests():
    assert load_tool().render() in (ROOT / "docs" / "support.md").read_text(), \
        "docs/support.md's support table is stale: run python tools/support_table.py --write"


def test_each_engine_adapter_has_its_declared_contract_folder():
    """`adapters/<engine>/` is the product's top-level home of each adapter's declared contract (DESIGN.md):
    one per engine package, each with its manifest and its notes."""
    engines = {p.name for p in (ROOT / "openengine_adapters").iterdir() if (p / "backend.py").exists()}
    assert engines == {"vllm", "sglang", "trtllm"}
    for engine in engines:
        folder = ROOT / "adapters" / engine
        assert (folder / "manifest.json").is_file() and (folder / "README.md").is_file(), folder
    assert not (ROOT / "manifests").exists()
