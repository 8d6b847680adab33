"""TEST ENVIRONMENT ONLY (tests/vllm/shims is put on PYTHONPATH by the nox ``vllm`` session).

NIXL's Python agent hard-codes ``pthrDelay = 0`` (nixl 1.5.1, ``nixl_cu1x/_api.py``, ``nixl_agent.__init__``):
the UCX progress thread of every engine with a NixlConnector polls without sleeping and holds one core
(measured: a decode sidecar's worker at 104% CPU while idle). On the 2-core CI machine a prefill + decode
pair therefore leaves no core for the engines' own work: the interop pair took 469 s to start and its
servers missed 10 s deadlines, against 47 s and a clean run with a 2 ms delay (worker 8% CPU while idle).
This gives the progress thread that 2 ms pause; what NIXL moves and when a transfer completes is unchanged
(the engine polls for completions itself). Runs in every process of the test venv (vLLM's engine core and
workers too). The product leaves NIXL as it is: adapters/vllm/README.md tells users about the spinning core.
"""

import importlib.abc
import importlib.util
import sys

PROGRESS_DELAY_US = 2000
_MODULES = ("nixl_cu12._api", "nixl_cu13._api")


class _Bindings:
    """``nixl_cu1x._bindings`` as ``_api`` sees it, with agents created with the progress delay."""

    def __init__(self, bindings):
        self._bindings = bindings

    def __getattr__(self, name):
        return getattr(self._bindings, name)

    def nixlAgent(self, name, config):  # noqa: N802 (the binding's name)
        config.pthrDelay = max(config.pthrDelay, PROGRESS_DELAY_US)
        return self._bindings.nixlAgent(name, config)


class _PaceNixlProgressThread(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.nixlBind = _Bindings(module.nixlBind)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PaceNixlProgressThread())
