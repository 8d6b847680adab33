"""The v0.1.0 reading of a request: what it accepts that revision 1 refuses, counted and said once.

Upstream's v0.1.0 text (and the clients that speak it: Dynamo's sidecars, TensorRT-LLM's own server)
reads these requests as servable, where revision 1 refuses every unadvertised explicit option:

- ``openengine-priority`` on a model without priority support: "used only when the selected model and
  task advertise priority support", so the request is served in the engine's default order;
- an explicit default of an unadvertised option (``bypass_prefix_cache = false``, an empty
  ``cache_salt``, ``include_stop_in_output = false``): it asks for what the engine does anyway;
- an option the engine would ignore (``GenerationSupport.ignored_options``): refused unless the
  operator chose ``--ignored-options ignore``; then dropped;
- PREFILL requests with output logprobs, guided decoding, ``min_tokens`` and stop conditions, and
  DECODE requests without a KV session (conditional disaggregation: served locally).

Each accepted-but-not-applied request is counted here (Prometheus, ``GetLoad`` attributes) and
logged once per process, so an operator sees that clients ask for what this engine does not do.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger(__name__)

REFUSE, IGNORE = "refuse", "ignore"
IGNORED_OPTIONS_POLICIES = (REFUSE, IGNORE)
IGNORED_OPTIONS_ENV = "OPENENGINE_IGNORED_OPTIONS"  # the plugins' --ignored-options

PRIORITY_ATTRIBUTE = "openengine.priority_ignored"
OPTION_ATTRIBUTE = "openengine.option_ignored."  # + the field, e.g. openengine.option_ignored.sampling.seed


class Leniency:
    """The v0.1.0 surface's tallies of what it accepted without applying (one per server)."""

    def __init__(self, ignored_options: str = REFUSE) -> None:
        if ignored_options not in IGNORED_OPTIONS_POLICIES:
            raise ValueError(f"ignored_options: {ignored_options!r} is not one of "
                             f"{', '.join(IGNORED_OPTIONS_POLICIES)}")
        self.ignored_options = ignored_options
        self.priority_ignored = 0
        self.options_ignored: Counter[str] = Counter()
        self._said: set[str] = set()

    def _once(self, key: str, message: str, *args) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)

    def priority(self, model: str) -> None:
        """An ``openengine-priority`` the model does not schedule by: served in default order."""
        self.priority_ignored += 1
        self._once("priority", "openengine-priority is sent to model %s, which does not schedule by priority: "
                   "requests are served in the engine's default order (counted as %s; said once)",
                   model, PRIORITY_ATTRIBUTE)

    def option(self, field: str, reason: str) -> None:
        """An option the engine would ignore, accepted under ``--ignored-options ignore`` and dropped."""
        self.options_ignored[field] += 1
        self._once(field, "%s is ignored (--ignored-options ignore): %s (counted as %s%s; said once)",
                   field, reason, OPTION_ATTRIBUTE, field)

    def attributes(self) -> dict[str, int]:
        """``GetLoad`` attributes, once there is something to say."""
        out = {PRIORITY_ATTRIBUTE: self.priority_ignored} if self.priority_ignored else {}
        out.update({OPTION_ATTRIBUTE + f: n for f, n in sorted(self.options_ignored.items())})
        return out
