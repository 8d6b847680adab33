"""What the engine launchers (``python -m openengine_adapters.<engine>``) share around their engine.

- ``--version``: ours, the engine's and the schema releases, without importing the engine.
- ``--help``: our flag groups first (``ours_first``), the engine's own flags after them.
- The gRPC port is checked before the engine starts (``check_port_early``), so a busy port fails in
  a second instead of after a minute of engine start-up.
- Our own flags are checked, and a model path that does not exist is said as such, before the port
  check and the engine import (``early_server_args``, ``check_model_path``).
- ``startup``: SIGINT/SIGTERM/SIGHUP during start-up stop the engine's processes and end the
  launcher with one line, no tracebacks; an engine that fails to start ends with one line too.
- ``EngineLauncher``: these steps in one order for every engine, each engine's ``__main__`` saying
  only what differs.
- ``detach_engine_processes``: the engine processes a launcher spawns start in their own process
  group, so a Ctrl-C reaches the launcher alone, which drains and then stops its engine (as uvicorn
  does for its workers) instead of the engine aborting everything at once under it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import os
import re
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence

from openengine_adapters import engine_processes, schema

log = logging.getLogger("openengine_adapters.launcher")

# Signals that end a launcher: Ctrl-C, a service manager's stop, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StartupFailed(Exception):
    """The engine did not start; the message is the one line the launcher ends with."""


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (pydantic's multi-line validation errors included, without
    their "For further information" links)."""
    lines = [line.strip() for line in str(exc).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    return f"{type(exc).__name__}: {' '.join(lines)}" if lines else type(exc).__name__


# --------------------------------------------------------------------------------------------
# --version


def distribution_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed (no import)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_text(engine: str, engine_version: str | None) -> str:
    """``--version``: this package, the engine, and the schema release of every surface served."""
    lines = [f"openengine-adapters {distribution_version('openengine-adapters') or 'unknown'}",
             f"{engine} {engine_version or 'not installed'}",
             f"openengine.v1 revision {schema.SCHEMA_REVISION} (service openengine.v1.OpenEngine): "
             f"schema_release {schema.SCHEMA_RELEASE}"]
    v0_1 = getattr(schema, "V0_1_SCHEMA_RELEASE", None)
    if v0_1:
        tag = getattr(schema, "V0_1_GIT_TAG_COMMIT", None)
        lines.append(f"openengine.v1 v0.1.0 (services openengine.v1.Inference, openengine.v1.Control): "
                     f"schema_release {v0_1}" + (f" (git tag v0.1.0 = {tag})" if tag else ""))
    return "\n".join(lines)


def handle_version(argv: Sequence[str], engine: str, engine_version: str | None) -> None:
    """Print ``--version`` and exit, before any engine import (argparse would need the engine's flags)."""
    if "--version" in argv:
        print(version_text(engine, engine_version))
        raise SystemExit(0)


def add_version_flag(group, engine: str, engine_version: str | None) -> None:
    """``--version`` as a listed flag (``handle_version`` answers it before the parser exists)."""
    group.add_argument("--version", action="version", version=version_text(engine, engine_version),
                       help="print this package's, the engine's and the schema releases' versions, then exit")


# --------------------------------------------------------------------------------------------
# argv helpers


def flag_given(argv: Sequence[str], *flags: str, underscores: bool = False) -> bool:
    """Whether any of ``flags`` (``--name``) is on the command line, as ``--name`` or ``--name=...``
    (``underscores``: also ``--na_me``, as vLLM's parser accepts)."""
    wanted = set(flags)
    for arg in argv:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        if underscores:
            name = "--" + name[2:].replace("_", "-")
        if name in wanted:
            return True
    return False


def early_server_args(argv: Sequence[str], prog: str | None = None, model_flag: str | None = None,
                      adapter_args=None) -> argparse.Namespace | None:
    """Our server and security flags read and checked before the engine is even imported (None when
    the command line asks for help): a bad value ends the launcher here, exit 2 naming the flag and
    the rule, before the port check and before the engine's own parser. ``model_flag`` (the engine's
    model flag, e.g. ``--model``): a local model path that does not exist is said here too, so a
    missing model is not reported as a busy port. ``adapter_args(parser)`` adds the adapter's own flags
    (engine-free). Unknown flags are left to the engine's parser."""
    if any(a in ("-h", "--help") or a.startswith("--help=") for a in argv):
        return None
    from openengine_adapters.server_config import add_server_args

    p = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    add_server_args(p)
    if adapter_args is not None:
        adapter_args(p)
    if model_flag:
        p.add_argument(model_flag, dest="early_model", default=None)
    normalised = [("--" + a[2:].split("=", 1)[0].replace("_", "-") + a[len(a.split("=", 1)[0]):])
                  if a.startswith("--") else a for a in argv]
    ns, _ = p.parse_known_args(normalised)  # exits 2 with the flag and the rule
    if model_flag:
        check_model_path(ns.early_model, model_flag)
    return ns


# --------------------------------------------------------------------------------------------
# --help: our flags first


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``(default: X)`` where X means something: not for switches (``--no-reflection``, whose
    ``default: True`` is the setting it turns off), nor for an absent or empty default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.nargs == 0 or action.default in (None, "", [], argparse.SUPPRESS) \
                or isinstance(action, argparse.BooleanOptionalAction):
            return action.help or ""
        return super()._get_help_string(action)


def ours_first(parser: argparse.ArgumentParser, titles: Iterable[str]) -> None:
    """Move our argument groups (by title) to the top of ``--help``, in the order given."""
    titles = list(titles)
    groups = {g.title: g for g in parser._action_groups}
    ours = [groups[t] for t in titles if t in groups]
    rest = [g for g in parser._action_groups if g not in ours]
    parser._action_groups[:] = ours + rest


# --------------------------------------------------------------------------------------------
# the gRPC port, before the engine starts


def check_port_early(ns: argparse.Namespace | None):
    """Reserve (bind, not listen) the gRPC port before the engine starts; a busy port ends the
    launcher here, with one line. Returns the reservation (release it right before serving)."""
    if ns is None:
        return None
    from openengine_adapters.server import PortInUse, reserve_port

    try:
        return reserve_port(ns.host, ns.port, reuse_port=ns.reuse_port)
    except PortInUse as exc:
        raise SystemExit(f"error: {exc}") from None


def recheck_port(reservation, ns: argparse.Namespace):
    """After the full parse: the same reservation if host/port agree with the early read, else a new one."""
    if reservation is not None and (reservation.host, reservation.requested_port) == (ns.host, ns.port):
        return reservation
    if reservation is not None:
        reservation.release()
    return check_port_early(argparse.Namespace(host=ns.host, port=ns.port,
                                               reuse_port=getattr(ns, "reuse_port", False)))


# --------------------------------------------------------------------------------------------
# the model path


_HUB_ID = re.compile(r"^[\w.\-]+(/[\w.\-]+)?$")


def check_model_path(value: str | None, flag: str) -> None:
    """A ``value`` that can only be a local path (absolute, ``./``, ``~``, or more than one ``/``)
    must exist: say so now instead of letting the hub client call it an invalid repo id."""
    if not value:
        return
    expanded = os.path.expanduser(value)
    if os.path.exists(expanded):
        return
    if value.startswith(("/", "./", "../", "~", ".\\")) or os.path.isabs(value) or not _HUB_ID.match(value):
        raise SystemExit(f"error: {flag} {value}: no such file or directory (a local model path must exist; "
                         "a hub model is named ORG/NAME)")


# --------------------------------------------------------------------------------------------
# start-up: signals, children, one-line failures


def detach_engine_processes() -> None:
    """Start the processes that the engine spawns from here (multiprocessing's "spawn", what vLLM and
    SGLang use for their engine cores, workers, schedulers) in their own process group, as the first
    thing they do: a terminal's Ctrl-C (sent to the whole foreground group) then reaches the launcher
    alone, which drains and stops its engine, as uvicorn and ``vllm serve`` do for their workers,
    instead of the engine aborting everything under it (and printing a traceback per process)."""
    engine_processes.add_spawn_prelude("import os; os.setpgid(0, 0); ")


class StartupInterrupted(BaseException):
    """A stop signal during start-up. Not a KeyboardInterrupt: engines swallow those in places
    (vLLM's ``zmq_socket_ctx`` does, around its start-up handshake, and would wait on)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt_startup(signum, frame) -> None:
    engine_processes.kill_engine_processes(wait=False)  # first, so that the engine's own clean-up finds them gone
    raise StartupInterrupted(signum)


@contextlib.contextmanager
def startup(engine: str) -> Iterator[None]:
    """The launcher's whole run: a stop signal before the server is up (``run`` takes the signals
    over once it is) kills the engine's processes and exits 130 with one line; ``StartupFailed``
    exits 1 with its line."""
    previous = {sig: signal.signal(sig, _interrupt_startup) for sig in STOP_SIGNALS}
    detach_engine_processes()
    try:
        yield
    except (StartupInterrupted, KeyboardInterrupt) as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
        engine_processes.kill_engine_processes()
        name = signal.Signals(exc.signum).name if isinstance(exc, StartupInterrupted) else "SIGINT"
        print(f"{name} during start-up: stopped the {engine} engine before it served", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except StartupFailed as exc:
        engine_processes.kill_engine_processes()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)


# --------------------------------------------------------------------------------------------
# the launcher's steps, in order


class EngineLauncher:
    """One engine's ``python -m openengine_adapters.<engine>``: the steps every launcher takes, in this
    order, with the engine saying only what differs. ``--version`` without importing the engine; stop
    signals during start-up handled (``startup``); our flags and the model path checked, then the
    gRPC port reserved, before the engine is imported; the engine's parser; the engine's own
    preparation (demo model, KV-event publisher, preflight); the engine started, a failure said in one
    line; the server run on the reserved port."""

    engine = ""  # its distribution's name, for --version
    display = ""  # how lines name the engine ("vLLM")
    prog = ""
    model_flag: str | None = None  # the engine's model flag, checked before the engine is imported

    def __init__(self) -> None:
        self.argv: list[str] = []

    def engine_version(self) -> str | None:
        raise NotImplementedError

    def add_adapter_args(self, parser: argparse.ArgumentParser) -> None:
        """The adapter's own flags, read with ours before the engine is imported."""

    def build_parser(self) -> argparse.ArgumentParser:
        raise NotImplementedError

    def first(self) -> None:
        """What must happen before anything else in the process (environment for the engine)."""

    def early_args(self) -> argparse.Namespace | None:
        """Our flags (None for --help), read and checked before the port check."""
        return early_server_args(self.argv, self.prog, self.model_flag, self.add_adapter_args)

    def parse(self) -> argparse.Namespace:
        return self.build_parser().parse_args(self.argv)

    def prepare(self, ns: argparse.Namespace) -> None:
        """The engine's own defaults and checks once every flag is parsed (demo model, KV events)."""

    async def start_backend(self, ns: argparse.Namespace):
        raise NotImplementedError

    def startup_failure(self, exc: Exception) -> str:
        """The one line a failed engine start ends with."""
        return f"the {self.display} engine failed to start: {one_line(exc)}"

    def server_config(self, ns: argparse.Namespace):
        from openengine_adapters.server_config import server_config_from_args

        return server_config_from_args(ns)

    async def serve(self, ns: argparse.Namespace, reservation) -> None:
        from openengine_adapters.server import run

        try:
            backend = await self.start_backend(ns)
        except (SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise StartupFailed(self.startup_failure(exc)) from exc
        if reservation is not None:
            reservation.release()
            ns.port = reservation.port  # port 0: the one reserved
        await run(backend, self.server_config(ns))

    def run_loop(self, coro) -> None:
        asyncio.run(coro)

    def after_serving(self) -> None:
        """Served and stopped: what the process does last."""

    def main(self, argv: list[str] | None = None) -> None:
        self.argv = list(sys.argv[1:] if argv is None else argv)
        handle_version(self.argv, self.engine, self.engine_version())
        with startup(self.display):
            self.first()
            reservation = check_port_early(self.early_args())
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            ns = self.parse()
            reservation = recheck_port(reservation, ns)
            self.prepare(ns)
            self.run_loop(self.serve(ns, reservation))
        self.after_serving()


# --------------------------------------------------------------------------------------------
# the engine's KV-event publisher on a private endpoint


def _free_run(count: int, taken: set[int]) -> int:
    """A loopback port P with P .. P+count-1 free now (engines offset the port by DP rank)."""
    import socket

    for _ in range(64):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        ports = range(base, base + count)
        if base + count > 65535 or taken & set(ports):
            continue
        socks = []
        try:
            for port in ports[1:]:
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
        taken.update(ports)
        return base
    raise OSError("no free loopback port range for the KV-event publisher")


def loopback_endpoints(ranks: int = 1) -> tuple[str, str]:
    """(publisher endpoint, replay endpoint) on 127.0.0.1, free for ``ranks`` DP ranks: reachable from
    this host only, so they are used by this server's KV-event bridge and not advertised. Free when
    chosen, not when the engine binds them: ``start_retrying_port_races`` covers the gap."""
    taken: set[int] = set()
    pub, replay = _free_run(ranks, taken), _free_run(ranks, taken)
    return f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"


_IPC_PATH_MAX = 100  # sockaddr_un holds 108 bytes


def private_endpoints(ranks: int = 1) -> tuple[str, str]:
    """(publisher endpoint, replay endpoint) for the engine's KV-event publisher that only this user
    reaches and nobody can take first: ``ipc://`` sockets in a fresh 0700 directory (removed at exit),
    which vLLM's and SGLang's ``ZmqEventPublisher`` bind (``_is_bind_endpoint``). Both refuse ipc for
    data-parallel ranks above 0 (``offset_endpoint_port``: "must contain 'inproc' or 'tcp'"), so more
    ranks get ``loopback_endpoints``."""
    if ranks == 1:
        import atexit
        import shutil
        import tempfile

        directory = tempfile.mkdtemp(prefix="openengine-kv-")  # mode 0700
        pub, replay = f"ipc://{directory}/events", f"ipc://{directory}/replay"
        if len(replay) <= _IPC_PATH_MAX:
            atexit.register(shutil.rmtree, directory, True)
            return pub, replay
        os.rmdir(directory)
    return loopback_endpoints(ranks)


def taken_ports(endpoints: Iterable[str | None], ranks: int = 1) -> list[int]:
    """The loopback ports of ``endpoints`` (and of their DP ranks' offsets) that another process
    holds now: after an engine failed to start, a race for a chosen port that it lost."""
    import errno
    import socket

    from openengine_adapters.kv_events.sources import split_tcp

    taken = []
    for endpoint in endpoints:
        parts = split_tcp(endpoint or "")
        if parts is None:
            continue
        for port in range(parts[1], parts[1] + ranks):
            with socket.socket() as s:
                try:
                    s.bind((parts[0], port))
                except OSError as exc:
                    if exc.errno == errno.EADDRINUSE:
                        taken.append(port)
    return taken


async def start_retrying_port_races(start, endpoints, choose_again, ranks: int = 1, attempts: int = 3):
    """``await start()``; when it fails and a loopback port of ``endpoints()`` (which this launcher
    chose for the engine) is now held by another process, the engine lost the race for it between our
    choice and its bind: ``choose_again()`` and start again, up to ``attempts`` times in all."""
    for attempt in range(1, attempts + 1):
        try:
            return await start()
        except Exception:
            taken = taken_ports(endpoints(), ranks)
            if not taken or attempt == attempts:
                raise
            log.warning("another process took loopback port(s) %s that this launcher chose for the engine "
                        "before the engine bound them: choosing others and starting again (attempt %d of %d)",
                        ", ".join(map(str, taken)), attempt + 1, attempts)
            choose_again()
