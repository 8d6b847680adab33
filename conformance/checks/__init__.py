"""One module per domain; importing this package registers every check (``all_checks`` lists them)."""

from conformance.checks import (  # noqa: F401 - importing a domain module registers its checks
    errors,
    generate,
    guided,
    identity,
    kv,
    lifecycle,
    lora,
    model_info,
    runtime,
    sampling,
    tasks,
    v0_1,
)
from conformance.registry import DOMAINS, REGISTRY, Check


def all_checks() -> list[Check]:
    """Every registered check in run order: non-destructive first, then by ``order``, domain, registration."""
    indexed = list(enumerate(REGISTRY))
    domains = {d: i for i, d in enumerate(DOMAINS)}
    indexed.sort(key=lambda p: (p[1].destructive, p[1].order, domains.get(p[1].domain, len(domains)), p[0]))
    return [c for _, c in indexed]
