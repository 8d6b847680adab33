"""Run the OpenEngine server on the fake engine as a process (signal, CLI, TLS and auth tests; trying
the protocol by hand). It takes the launchers' flags (``add_server_args``: security included) and logs
at INFO to stderr; the ``ready on HOST:PORT`` line goes to stdout."""

import argparse
import asyncio
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_backend import FakeBackend  # noqa: E402

from openengine_adapters.server import run
from openengine_adapters.server_config import add_server_args, server_config_from_args

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    asyncio.run(run(FakeBackend(), server_config_from_args(parser.parse_args())))
