"""Regenerate the committed Python stubs of both contracts.

- Revision 1 (``proto/openengine/v1``) -> ``openengine_adapters/v1``.
- Upstream v0.1.0 (``proto/upstream-v0.1.0/openengine/v1``, vendored unchanged) ->
  ``openengine_adapters/v0_1``, compiled from a *shifted* copy: both contracts declare package
  ``openengine.v1`` with clashing message names, and Python's default descriptor pool refuses two
  such files. The shifted message files live at ``openengine/v1/upstream/*.proto`` in package
  ``openengine.v1.upstream``; the service file keeps ``package openengine.v1`` (method paths such
  as ``/openengine.v1.Inference/Generate`` travel on the wire, message full names never do).

protoc emits imports rooted at the proto path (``from openengine.v1 import x_pb2``); the stubs
live inside our package (the top-level name ``openengine`` is taken on PyPI), so those imports
are rewritten.

Usage: python tools/gen_proto.py [OUT_ROOT]   (default: openengine_adapters)
"""

from __future__ import annotations

import pathlib
import re
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
REVISION1_PROTOS = ROOT / "proto"
UPSTREAM_PROTOS = ROOT / "proto" / "upstream-v0.1.0"
PACKAGE_ROOT = ROOT / "openengine_adapters"
SHIFTED_PACKAGE = "openengine.v1.upstream"
SERVICE_FILE = "openengine.proto"
_RPC_TYPES = re.compile(r"\((stream )?(\w+)\)")


def shift(name: str, text: str) -> str:
    """One canonical v0.1.0 file as compiled here: imports under openengine/v1/upstream; message
    files in the shifted package; the service file's RPC types qualified into it."""
    text = text.replace('import "openengine/v1/', 'import "openengine/v1/upstream/')
    if name == SERVICE_FILE:
        return _RPC_TYPES.sub(lambda m: f"({m.group(1) or ''}upstream.{m.group(2)})", text)
    return text.replace("package openengine.v1;", f"package {SHIFTED_PACKAGE};")


def _protoc(proto_root: pathlib.Path, protos: list[str], out: pathlib.Path) -> None:
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out}",
                      f"--pyi_out={out}", f"--grpc_python_out={out}", *protos])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def _copy(src_dir: pathlib.Path, out_dir: pathlib.Path, module: bytes, package: str) -> list[pathlib.Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    imports = re.compile(rb"^from " + re.escape(module) + rb" import ", re.MULTILINE)
    for src in sorted(p for p in src_dir.iterdir() if p.is_file()):
        if src.name.endswith("_pb2_grpc.py") and b"Stub" not in src.read_bytes():
            continue  # only the service file declares services
        dst = out_dir / src.name
        dst.write_bytes(imports.sub(b"from " + package.encode() + b" import ", src.read_bytes()))
        written.append(dst)
    return written


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    """Write both contracts' stubs under out_root (``v1/`` and ``v0_1/``); return the files."""
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        rev1 = sorted(str(p.relative_to(REVISION1_PROTOS)) for p in (REVISION1_PROTOS / "openengine").rglob("*.proto"))
        _protoc(REVISION1_PROTOS, rev1, tmp / "rev1")
        written += _copy(tmp / "rev1" / "openengine" / "v1", out_root / "v1", b"openengine.v1",
                         "openengine_adapters.v1")
        shifted_root = tmp / "shifted"
        target = shifted_root / "openengine" / "v1" / "upstream"
        target.mkdir(parents=True)
        for src in sorted((UPSTREAM_PROTOS / "openengine" / "v1").glob("*.proto")):
            (target / src.name).write_text(shift(src.name, src.read_text(encoding="utf-8")), encoding="utf-8")
        _protoc(shifted_root, sorted(str(p.relative_to(shifted_root)) for p in target.glob("*.proto")),
                tmp / "v0_1")
        written += _copy(tmp / "v0_1" / "openengine" / "v1" / "upstream", out_root / "v0_1",
                         b"openengine.v1.upstream", "openengine_adapters.v0_1")
    for sub, doc in (("v1", "openengine.v1 revision 1 stubs"),
                     ("v0_1", "openengine.v1 v0.1.0 stubs (shifted message package, see tools/gen_proto.py)")):
        init = out_root / sub / "__init__.py"
        init.write_text(f'"""Generated {doc}; do not edit."""\n')
        written.append(init)
    return written


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_ROOT
    for path in generate(target):
        print(path)
