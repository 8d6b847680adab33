"""TEST ENVIRONMENT ONLY: an import-only stand-in for ``sgl_kernel`` (never shipped, never in the product).

PyPI has only CUDA builds of ``sglang-kernel``; SGLang imports ``sgl_kernel`` (and submodules) at module
level in code paths that the CPU engine with ``attention_backend="torch_native"`` never calls (its CPU ops
are used on AMX CPUs or for speculative decoding; the layers fall back to ``forward_native``). This
package lets those imports succeed. Any attribute is a callable that raises when CALLED, so a code path
that really needs a kernel fails loudly instead of silently computing something else.
See engines/sglang.md, "Running it on these machines".
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+openengine-test-shim"


class _MissingKernel:
    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._qualname}: sgl_kernel test shim has no kernels (CPU test environment)")

    def __getattr__(self, name: str) -> _MissingKernel:
        if name.startswith("__"):
            raise AttributeError(name)
        return _MissingKernel(f"{self._qualname}.{name}")

    def __repr__(self) -> str:
        return f"<missing sgl_kernel op {self._qualname}>"


class _ShimModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _MissingKernel(f"{self.__name__}.{name}")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.<sub>`` import gets a shim module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _ShimModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        return None


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _MissingKernel(f"{__name__}.{name}")


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())
