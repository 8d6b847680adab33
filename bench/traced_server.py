"""Run a server under tracemalloc, dumping a heap snapshot on each SIGUSR2 (bench/soak.py --trace).

  python bench/traced_server.py SNAPSHOT_DIR (-m MODULE | SCRIPT) [ARGS ...]

Tracing starts at the first SIGUSR2, once the server is up (imports and engine start-up under
tracemalloc would take minutes, and only what serving keeps matters); that and each later SIGUSR2
write ``SNAPSHOT_DIR/<n>.snap`` (``tracemalloc.Snapshot.dump``), after a full garbage collection so
cycles awaiting the collector do not count as held. A snapshot holds only what was allocated after
tracing started and is still alive: the difference of two is what the requests between them left
behind. Child processes forked while tracing stop tracing at once. Frames per traceback:
$OPENENGINE_TRACE_FRAMES (default 12).
"""

from __future__ import annotations

import gc
import itertools
import os
import runpy
import signal
import sys
import tracemalloc


def main() -> None:
    out, target, *rest = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    counter = itertools.count()

    def dump(signum, frame) -> None:
        gc.collect()
        if not tracemalloc.is_tracing():
            tracemalloc.start(int(os.environ.get("OPENENGINE_TRACE_FRAMES", "12")))
        tracemalloc.take_snapshot().dump(os.path.join(out, f"{next(counter)}.snap"))

    os.register_at_fork(after_in_child=tracemalloc.stop)
    signal.signal(signal.SIGUSR2, dump)
    if target == "-m":
        module, *rest = rest
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *rest]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
