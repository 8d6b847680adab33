"""Run the OpenEngine server on the fake engine as a process (for signal tests)."""

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_backend import FakeBackend  # noqa: E402

from openengine_adapters.server import add_server_args, run, server_config_from_args  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    asyncio.run(run(FakeBackend(), server_config_from_args(parser.parse_args())))
