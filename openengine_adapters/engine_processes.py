"""What every engine process a launcher spawns does first, and how it ends.

vLLM and SGLang start their engine cores, workers and schedulers with multiprocessing's "spawn": a new
interpreter whose first statement is given by ``multiprocessing.spawn.get_command_line``. That one
function is wrapped here, once, to put the statements of ``add_spawn_prelude`` in front of it:

- ``prepare`` (the launcher, and through ``PRELUDE`` every process below it) treats CUDA builds of
  torchvision/torchaudio/torchcodec beside a CPU torch as not installed (``torch_extensions``) before
  the engine's imports reach them, and ends each spawned process without the interpreter's final
  teardown once its work and everyone's ``atexit`` clean-up are done: the teardown is where
  nanobind-built extensions (Triton's) print dozens of ``nanobind: leaked ...`` lines at every exit;
- the launcher starts them in their own process group (``launcher.detach_engine_processes``);
- ``kill_engine_processes`` ends what is left of them when the launcher stops or its engine died.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

PRELUDE = "from openengine_adapters import engine_processes; engine_processes.prepare(child=True); "
_preludes: list[str] = []  # the statements every spawned process runs first, in order


def add_spawn_prelude(statement: str) -> None:
    """Run ``statement`` (ending in ``; ``) first in every process spawned from this one (idempotent)."""
    import multiprocessing.spawn as spawn

    if statement not in _preludes:
        _preludes.append(statement)
    if getattr(spawn.get_command_line, "openengine_prelude", False):
        return
    original = spawn.get_command_line

    def get_command_line(**kwds):
        cmd = list(original(**kwds))
        if "-c" in cmd[:-1]:
            i = cmd.index("-c") + 1
            cmd[i] = "".join(_preludes) + cmd[i]
        return cmd

    get_command_line.openengine_prelude = True
    spawn.get_command_line = get_command_line


def kill_engine_processes(wait: bool = True) -> None:
    """SIGKILL every process this one started (the engine's), except multiprocessing's resource
    tracker, which then frees their shared memory."""
    try:
        import psutil  # a dependency of vLLM, SGLang and TensorRT-LLM
    except ImportError:
        return
    me = psutil.Process()
    victims = []
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
            victims.append(child)
    for child in victims:
        with contextlib.suppress(psutil.Error):
            child.kill()
    if wait:
        psutil.wait_procs(victims, timeout=5)


def end_without_teardown(code: int) -> None:
    """End this process now: everyone's atexit clean-up, flushed output, then exit ``code`` without
    the interpreter's teardown (the launcher, once it has stopped its engine)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing left to say
            pass
    os._exit(code)


def _end_without_teardown() -> None:
    """A spawned process's ``spawn_main`` ends in ``sys.exit(code)``: run the atexit clean-up then,
    flush, and leave with the same code, skipping the interpreter's teardown."""
    import multiprocessing.spawn as spawn

    original = spawn.spawn_main
    if getattr(original, "openengine_prelude", False):
        return

    def spawn_main(*args, **kwargs):
        try:
            original(*args, **kwargs)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except EOFError:
            # the parent ended before it handed this process its work (the launcher stopped during
            # start-up, taking a half-spawned engine process with it): nothing ran, nothing to report.
            # Only this hand-over can raise here: the work's own errors end in its _bootstrap.
            code = 1
        end_without_teardown(code)

    spawn_main.openengine_prelude = True
    spawn.spawn_main = spawn_main


def prepare(child: bool = False) -> None:
    """In a launcher (``child`` False) or, through ``PRELUDE``, in each process it spawns."""
    from openengine_adapters import torch_extensions

    torch_extensions.install()
    add_spawn_prelude(PRELUDE)
    if child:
        _end_without_teardown()
