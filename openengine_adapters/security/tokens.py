"""Bearer tokens: which keys a caller may present, and which one it did present.

Keys are kept only as SHA-256 digests and every presented token is compared with every key through
``hmac.compare_digest`` on equal-length digests, so neither the time taken nor an early exit tells
a caller how much of a key it guessed, or which key list it matched.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable


class Caller(enum.Enum):
    """Who a call's ``authorization`` metadata says the caller is."""

    ANONYMOUS = "anonymous"  # no authorization metadata
    INVALID = "invalid"  # a token (or a malformed header) that matches no key
    CLIENT = "client"  # an API key
    OPERATOR = "operator"  # an admin (control-plane) key


def read_key_file(path: str) -> tuple[str, ...]:
    """One key per line; blank lines and ``#`` comments are skipped. A file without keys is an error
    (an empty secret mount must not silently turn authentication off)."""
    with open(path, encoding="utf-8") as fh:
        keys = tuple(line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise ValueError(f"{path}: no keys in the file")
    return keys


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of ``authorization: Bearer <token>``; "" for any other authorization value; None
    when the header is absent."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class TokenSet:
    """The configured API keys (any RPC) and admin keys (operator RPCs, and any other RPC)."""

    def __init__(self, client_keys: Iterable[str] = (), admin_keys: Iterable[str] = ()) -> None:
        client_keys, admin_keys = tuple(client_keys), tuple(admin_keys)
        if any(not k or k != k.strip() or any(ord(c) < 0x21 or ord(c) > 0x7e for c in k)
               for k in client_keys + admin_keys):
            raise ValueError("API keys must be non-empty printable ASCII without spaces")
        self._keys = [(_digest(k), Caller.CLIENT) for k in dict.fromkeys(client_keys)]
        self._keys += [(_digest(k), Caller.OPERATOR) for k in dict.fromkeys(admin_keys)]
        self.clients_need_key = bool(client_keys)
        self.has_admin_key = bool(admin_keys)

    @property
    def configured(self) -> bool:
        return bool(self._keys)

    def identify(self, metadata) -> Caller:
        """With no key configured every caller is ANONYMOUS: an ``authorization`` header is then
        meant for someone else (a proxy) and is not judged here."""
        token = bearer_token(metadata)
        if token is None or not self._keys:
            return Caller.ANONYMOUS
        presented = _digest(token)
        found = Caller.INVALID
        for digest, caller in self._keys:  # no early exit: every key is compared
            if hmac.compare_digest(presented, digest):
                found = caller
        return found
