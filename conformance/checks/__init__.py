"""One module per domain; importing this package registers every check."""

from conformance.checks import (  # noqa: F401
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
