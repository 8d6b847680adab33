"""Handed-off prefill sessions, bounded, and the guarantees a decode relies on.

A PREFILL engine remembers the sessions it handed off (until the lease runs out, Abort(kv_session)
forgets them, or capacity pushes out the oldest); a DECODE engine remembers the handoffs it used:
a second decode of one session would read KV the prefill side has released, so it is refused,
and a decode of another prompt than the one sealed into the session is refused before acceptance.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from openengine_adapters.errors import invalid, not_found
from openengine_adapters.types import ErrorCode

# session attributes that seal the prompt the KV belongs to
DIGEST_KEY = "prompt_digest"
TOKENS_KEY = "prompt_tokens"
TEXT_DIGEST = "blake2b-128-text:"
IDS_DIGEST = "blake2b-128:"


def prompt_digest(token_ids: Sequence[int]) -> str:
    """The digest of a prompt's token ids."""
    return IDS_DIGEST + hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).hexdigest()


def text_digest(text: str) -> str:
    """The digest of a text prompt as sent (the engine tokenizes it on both sides alike)."""
    return TEXT_DIGEST + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def seal(prompt: str | None, token_ids: Sequence[int] | None) -> dict[str, Any]:
    """Session attributes naming the prompt a prefill ran on (token ids when known, else the text)."""
    if token_ids is not None:
        return {TOKENS_KEY: len(token_ids), DIGEST_KEY: prompt_digest(token_ids)}
    return {DIGEST_KEY: text_digest(prompt or "")}


def check_seal(attributes: Mapping[str, Any], prompt: str | None, token_ids: Sequence[int] | None) -> None:
    """Refuse a decode whose prompt is not the sealed one. A session without a seal (another
    producer's) and a seal of the other prompt kind (text vs token ids, which only the engine's
    tokenizer could compare) are not checked."""
    digest = attributes.get(DIGEST_KEY)
    if digest is None:
        return
    if not isinstance(digest, str):
        raise invalid(f"kv.session.attributes_struct.{DIGEST_KEY}: must be a string")
    if token_ids is not None and digest.startswith(IDS_DIGEST):
        sealed = attributes.get(TOKENS_KEY)
        if isinstance(sealed, int | float) and int(sealed) != len(token_ids):
            raise invalid(f"prompt: {len(token_ids)} prompt tokens, but the KV session holds KV for "
                          f"{int(sealed)} (decode must send the prefill's prompt)")
        if prompt_digest(token_ids) != digest:
            raise invalid(f"prompt: differs from the prompt the KV session was prefilled with "
                          f"(kv.session.attributes_struct.{DIGEST_KEY})")
    elif token_ids is None and prompt is not None and digest.startswith(TEXT_DIGEST):
        if text_digest(prompt) != digest:
            raise invalid(f"prompt: differs from the prompt the KV session was prefilled with "
                          f"(kv.session.attributes_struct.{DIGEST_KEY})")


# ---------------------------------------------------------------------------- session attributes
# A KvSessionRef's attributes_struct is a protobuf Struct: its numbers arrive as doubles.


def struct_int(value: Any, name: str) -> int:
    """An integer from a Struct value: numbers arrive as doubles; big ids may be decimal strings."""
    if isinstance(value, bool):
        raise invalid(f"kv.session.attributes_struct.{name}: must be an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise invalid(f"kv.session.attributes_struct.{name}: must be an integer, got {value!r}")


def restore_struct_ints(value: Any) -> Any:
    """A Struct value with its integral doubles given back as ints (ports, block ids, sizes), at
    any depth: engine handoffs read them as ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [restore_struct_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: restore_struct_ints(v) for k, v in value.items()}
    return value


class SessionTable:
    """Sessions by side: on a prefill engine the handed-off ones (with an engine handle, e.g. the
    request ids to abort), on a decode engine the handoffs already used and the decodes in flight.
    Both sides are bounded by ``capacity`` (the oldest entry goes first)."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._held: OrderedDict[str, tuple[float | None, Any]] = OrderedDict()  # id -> (expiry, handle)
        self._consumed: OrderedDict[str, None] = OrderedDict()
        self.decoding = 0

    # ------------------------------------------------------------------ prefill side

    def hand_off(self, session_id: str, handle: Any = None, lease_s: float | None = None) -> None:
        """Remember a handed-off session; ``lease_s``: when the engine frees its KV by itself."""
        self._held[session_id] = (None if lease_s is None else time.monotonic() + lease_s, handle)
        self._held.move_to_end(session_id)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)

    def release(self, session_id: str) -> tuple[bool, Any]:
        """Forget a session: (whether it was held, its handle)."""
        self._expire()
        entry = self._held.pop(session_id, None)
        return (False, None) if entry is None else (True, entry[1])

    def forget(self, session_id: str) -> bool:
        return self.release(session_id)[0]

    def held(self) -> int:
        self._expire()
        return len(self._held)

    def _expire(self) -> None:
        now = time.monotonic()
        for sid in [s for s, (exp, _) in self._held.items() if exp is not None and exp <= now]:
            del self._held[sid]

    # ------------------------------------------------------------------ decode side

    def consume(self, key: str) -> None:
        """Mark a handoff used; a second use is KV_SESSION_NOT_FOUND."""
        if key in self._consumed:
            raise not_found("kv.session: this KV session was already decoded (its KV is released on the "
                            "prefill side after the first pull)", ErrorCode.KV_SESSION_NOT_FOUND)
        self._consumed[key] = None
        while len(self._consumed) > self.capacity:
            self._consumed.popitem(last=False)

    def unconsume(self, key: str) -> None:
        """The decode request was refused after all: the handoff stays usable."""
        self._consumed.pop(key, None)
