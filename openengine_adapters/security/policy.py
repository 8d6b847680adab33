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
  allowed root (``--lora-root``); the core enforces both (``lora_load_refusal``), after it has
  answered FAILED_PRECONDITION for an engine without LoRA.
"""

from __future__ import annotations

import ipaddress

import grpc

from openengine_adapters.errors import RequestRejected
from openengine_adapters.security.tokens import Caller
from openengine_adapters.types import ErrorCode

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


def is_loopback(peer: str) -> bool:
    """``context.peer()`` (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) is this host."""
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return True
    if kind == "ipv4":
        host = rest.rpartition(":")[0]
    elif kind == "ipv6":
        host = rest.rpartition(":")[0].strip("[]").split("%")[0]
    else:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _auth_error(status: grpc.StatusCode, message: str) -> RequestRejected:
    reason = "unauthenticated" if status == grpc.StatusCode.UNAUTHENTICATED else "permission_denied"
    return RequestRejected(status, message, ErrorCode.UNSPECIFIED, details={"auth": reason})


def lora_load_refusal(root: str | None, peer: str) -> RequestRejected | None:
    """With no adapter root, only loopback may name directories on this host for LoadLora."""
    if root is None and not is_loopback(peer):
        return permission_denied("LoadLora from the network needs an allowed adapter root on this server "
                                 "(--lora-root); without one only loopback may load adapters")
    return None


def unauthenticated(message: str) -> RequestRejected:
    return _auth_error(grpc.StatusCode.UNAUTHENTICATED, message)


def permission_denied(message: str) -> RequestRejected:
    return _auth_error(grpc.StatusCode.PERMISSION_DENIED, message)


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
