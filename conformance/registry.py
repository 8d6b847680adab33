"""The check registry: each check is a small async function registered with ``@check``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


class Skip(Exception):  # noqa: N818 - reads as "raise Skip(reason)"
    """Raised by a check that does not apply to the target (the reason is reported)."""


class CheckFailed(AssertionError):
    """Raised by a check when the target violates the contract."""


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass(frozen=True)
class Check:
    name: str
    requires: str
    destructive: bool
    order: int
    func: Callable[..., Awaitable[None]]
    doc: str

    @property
    def domain(self) -> str:
        return self.name.split(".", 1)[0]


REGISTRY: list[Check] = []
DOMAINS = ("identity", "model_info", "generate", "sampling", "guided", "tasks", "lora", "lifecycle", "kv", "runtime",
           "errors", "v0_1")


def check(name: str, requires: str = "always", destructive: bool = False, order: int = 0):
    """Register ``async def fn(ctx)`` as check ``name``.

    ``requires`` states what the check needs from the target ("always", "advertised ...", "role
    AGGREGATED", ...); when the target does not meet it the check raises ``Skip`` with a reason.
    ``destructive`` checks change server state and run only with ``--destructive`` (after all the
    others, in ``order``).
    """

    def register(func):
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"check {name} must be an async function")
        if any(c.name == name for c in REGISTRY):
            raise ValueError(f"duplicate check name {name}")
        REGISTRY.append(Check(name, requires, destructive, order, func, (func.__doc__ or "").strip()))
        return func

    return register
