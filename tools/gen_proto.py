"""Regenerate the committed Python stubs from proto/openengine/v1/*.proto.

protoc emits imports rooted at the proto path (``from openengine.v1 import x_pb2``); the stubs
live inside our package (the top-level name ``openengine`` is taken on PyPI), so those imports
are rewritten to ``openengine_adapters.v1``. The descriptor file names stay
``openengine/v1/*.proto`` so reflection shows the canonical contract.

Usage: python tools/gen_proto.py [OUT_DIR]   (default: openengine_adapters/v1)
"""

from __future__ import annotations

import pathlib
import re
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = ROOT / "openengine_adapters" / "v1"
_IMPORT = re.compile(rb"^from openengine\.v1 import ", re.MULTILINE)


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write the stubs for every .proto into out_dir; return the files written."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main([
            "protoc", f"-I{PROTO_ROOT}", f"-I{include}",
            f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *protos,
        ])
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((pathlib.Path(tmp) / "openengine" / "v1").iterdir()):
            if src.name.endswith("_pb2_grpc.py") and b"Stub" not in src.read_bytes():
                continue  # only openengine.proto declares a service
            dst = out_dir / src.name
            dst.write_bytes(_IMPORT.sub(b"from openengine_adapters.v1 import ", src.read_bytes()))
            written.append(dst)
        init = out_dir / "__init__.py"
        init.write_text('"""Generated openengine.v1 stubs (tools/gen_proto.py); do not edit."""\n')
        written.append(init)
    return written


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR
    for path in generate(target):
        print(path)
