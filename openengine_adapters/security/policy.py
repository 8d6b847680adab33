"""Which RPCs are operator actions, and who may call them.

Aborting every request, draining the server (nothing undoes it) and loading or unloading LoRA
adapters act on everyone's work, so they are operator RPCs, on both surfaces. Abort of one
request or one KV session stays a client action: the Abort handler is wrapped and looks at the
decoded target. The rule:
- with an admin key configured, an operator RPC needs an admin key (a client key is
  PERMISSION_DENIED, no key or a wrong one UNAUTHENTICATED);
- without one, operator RPCs are accepted only from loopback peers (the host's own operator or
  sidecar), unless ``--allow-remote-operator`` opens them to every caller that passes authentication;
- LoadLora names a directory on the server's disk: from a non-loopback peer it also needs an
  allowed root (``--lora-root``); the core enforces both (``core.lora.lora_load_refusal``), after it
  has answered FAILED_PRECONDITION for an engine without LoRA.
"""

from __future__ import annotations

from openengine_adapters.errors import RequestRejected, permission_denied, unauthenticated
from openengine_adapters.security.tokens import Caller
from openengine_adapters.validation.peer import is_loopback

OPERATOR_METHODS = frozenset({
    "/openengine.v1.OpenEngine/Drain",
    "/openengine.v1.OpenEngine/LoadLora",
    "/openengine.v1.OpenEngine/UnloadLora",
    "/openengine.v1.Control/LoadLora",
    "/openengine.v1.Control/UnloadLora",
})
# operator RPCs only when the decoded request targets all requests
ABORT_METHODS = frozenset({"/openengine.v1.OpenEngine/Abort", "/openengine.v1.Control/Abort"})
# open to anyone: probes (kubelet, Docker HEALTHCHECK, load balancers) send no credentials
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)


class OperatorPolicy:
    def __init__(self, has_admin_key: bool, allow_remote: bool) -> None:
        self.has_admin_key = has_admin_key
        self.allow_remote = allow_remote

    def describe(self) -> str:
        if self.has_admin_key:
            return "operator RPCs (Abort all, Drain, LoadLora, UnloadLora) need the admin API key"
        if self.allow_remote:
            return ("operator RPCs (Abort all, Drain, LoadLora, UnloadLora) are open to every authenticated "
                    "caller (--allow-remote-operator, no admin key)")
        return ("operator RPCs (Abort all, Drain, LoadLora, UnloadLora) are accepted only from loopback "
                "(no admin API key; --admin-api-key or --allow-remote-operator opens them)")

    def refusal(self, caller: Caller, peer: str, what: str) -> RequestRejected | None:
        """Why this caller may not run the operator RPC ``what``; None when it may. (LoadLora's
        adapter-root rule is the core's: it comes after "is LoRA enabled at all".)"""
        if self.has_admin_key:
            if caller == Caller.OPERATOR:
                return None
            if caller == Caller.CLIENT:
                return permission_denied(f"{what} is an operator RPC: it needs the admin API key")
            return unauthenticated(f"{what} is an operator RPC: send the admin API key as "
                                   "'authorization: Bearer <key>'")
        if self.allow_remote or is_loopback(peer):
            return None
        return permission_denied(f"{what} is an operator RPC, accepted only from loopback on this server "
                                 "(no admin API key is configured)")
