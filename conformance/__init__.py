"""A black-box conformance suite for any OpenEngine (openengine.v1) gRPC server.

``python -m conformance --target HOST:PORT``; from code, ``run_suite(target, model, destructive)``.
"""

from conformance.report import Report, Result
from conformance.runner import run_suite, run_suite_async

__all__ = ["Report", "Result", "run_suite", "run_suite_async"]
