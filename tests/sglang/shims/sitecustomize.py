"""TEST ENVIRONMENT ONLY (tests/sglang/shims is put on PYTHONPATH by the nox ``sglang`` session).

PyPI's torchvision is a CUDA build whose compiled ops do not load beside the CPU torch; its
``_meta_registrations`` then registers fake kernels for ``torchvision::nms``/``qnms`` on operators
that do not exist, and ``import torchvision`` (which transformers and SGLang do) fails. Declaring the
two op schemas before torchvision's first import lets it import; the ops themselves are never used
by the text models the tests run. Runs in every process of the test venv (SGLang's scheduler and
detokenizer subprocesses too). See engines/sglang.md, "Running it on these machines".
"""

import importlib.abc
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


class _DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        global _LIB
        _LIB = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _SCHEMAS:
            try:
                _LIB.define(schema)
            except RuntimeError:  # already declared (a working torchvision build)
                pass
        return None  # let the normal finders import torchvision


_LIB = None
sys.meta_path.insert(0, _DeclareTorchvisionOps())
