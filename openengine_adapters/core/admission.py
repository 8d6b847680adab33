"""Admission control: a bounded number of in-flight requests per process.

A slot is taken before acceptance and given back only when the engine confirmed the request
ended (not when the client went away), so aborts that are still draining cannot over-admit.
Every entry point of a process shares one ``Admission``.
"""

from __future__ import annotations

import grpc

from openengine_adapters.errors import RequestRejected
from openengine_adapters.types import ErrorCode


class Admission:
    def __init__(self, limit: int | None, retry_after_ms: int = 100) -> None:
        if limit is not None and limit <= 0:
            raise ValueError("admission limit must be > 0 (or None for no limit)")
        self.limit = limit
        self.retry_after_ms = retry_after_ms
        self.in_flight = 0

    def acquire(self) -> None:
        """Take a slot or raise RESOURCE_EXHAUSTED with a retry hint."""
        if self.limit is not None and self.in_flight >= self.limit:
            raise RequestRejected(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"admission: {self.in_flight} requests in flight reach the limit of {self.limit}; "
                f"retry after {self.retry_after_ms} ms",
                ErrorCode.OVERLOADED,
                retry_after_ms=self.retry_after_ms,
            )
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1
