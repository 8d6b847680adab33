"""Where a call comes from: a loopback peer is this host's own operator or sidecar.

Read by the operator-RPC policy (``security.policy``) and by LoadLora's adapter-root rule
(``core.lora``).
"""

from __future__ import annotations

import ipaddress


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
