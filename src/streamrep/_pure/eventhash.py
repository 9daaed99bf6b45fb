"""Redaction, canonical JSON and the hashes of Matrix events (pure twin of
``streamrep._core.eventhash``; :mod:`streamrep.matrix.eventformat` applies them
per room version).

* :func:`prune` - the event as the redaction algorithm leaves it, by a room
  version's :class:`RedactionRules`;
* :func:`canonical_json` - the specification's canonical JSON: sorted keys, no
  insignificant whitespace, UTF-8, the shortest string escapes;
* :func:`content_hash` - SHA-256 of the event without ``unsigned``, ``signatures``
  and ``hashes`` (nor the legacy ``age_ts``, ``outlier`` and ``destinations``, as
  the reference implementation also leaves them out);
* :func:`reference_hash` - SHA-256 of the pruned event without ``signatures``,
  ``unsigned`` and ``age_ts``;
* :func:`unpadded_base64` and :func:`event_id_from_hash` - the encodings of hashes
  and event IDs;
* :func:`check_hashes` - whether an event matches its ID and its content hash, in
  one call (the event store's check on persist).

Numbers: with ``strict`` (room versions 6 on), only integers in
``[-(2**53)+1, (2**53)-1]``; a float with an integral value in that range is the
integer it denotes (JSON has one number type: ``1e10`` is ``10000000000``), any
other float is refused. Without ``strict`` (versions 1 to 5, whose events may hold
larger integers and floats) any integer is allowed and a finite float is written as
Python's JSON encoder writes it, as the reference implementation hashes them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from typing import Any, Iterable, Mapping

# The twins' API; CanonicalJsonError and RedactionRules, defined here once, are
# shared by both.
__all__ = ["prune", "canonical_json", "content_hash", "reference_hash", "unpadded_base64",
           "event_id_from_hash", "check_hashes", "check_records", "sha256", "sha256_pair", "sha256_blocks"]

#: The largest integer canonical JSON allows (and its negation the smallest).
MAX_SAFE_INTEGER = 2**53 - 1

#: Top-level keys the content hash leaves out.
CONTENT_HASH_EXCLUDED = ("unsigned", "signatures", "hashes", "age_ts", "outlier",
                         "destinations")
#: Top-level keys of the pruned event the reference hash leaves out.
REFERENCE_HASH_EXCLUDED = ("signatures", "unsigned", "age_ts")

#: What :func:`check_hashes` finds.
HASHES_MATCH = 0
BAD_EVENT_ID = 1
NO_CONTENT_HASH = 2
BAD_CONTENT_HASH = 3


class CanonicalJsonError(ValueError):
    """A value canonical JSON cannot encode (a float, an integer out of range, a
    key that is not a string, a string that is not valid Unicode, ...)."""


class RedactionRules:
    """What the redaction algorithm of one room version keeps.

    *top_level*: the top-level keys kept; *content*: per event type, the content
    keys kept (None: all of them; types not listed keep none); *nested*: per event
    type, content keys whose object value keeps only the listed keys (an object
    value is kept, emptied of the rest; any other value is dropped)."""

    __slots__ = ("top_level", "content", "nested")

    def __init__(self, top_level: Iterable[str],
                 content: Mapping[str, Iterable[str] | None],
                 nested: Mapping[str, Mapping[str, Iterable[str]]] | None = None) -> None:
        self.top_level = frozenset(top_level)
        self.content: dict[str, frozenset[str] | None] = {
            etype: None if keys is None else frozenset(keys) for etype, keys in content.items()}
        self.nested: dict[str, dict[str, frozenset[str]]] = {
            etype: {key: frozenset(sub) for key, sub in keys.items()}
            for etype, keys in (nested or {}).items()}


def prune(event: Mapping[str, Any], rules: RedactionRules) -> dict[str, Any]:
    """*event* (a mapping of its JSON fields) with every key the redaction algorithm
    removes taken out; the values kept are the event's own objects, not copies."""
    top = rules.top_level
    out = {key: value for key, value in event.items() if key in top}
    content = event.get("content")
    etype = event.get("type")
    if not isinstance(content, dict) or not isinstance(etype, str) or (
            etype not in rules.content):
        out["content"] = {}
        return out
    kept = rules.content[etype]
    if kept is None:
        out["content"] = dict(content)
        return out
    pruned = {key: value for key, value in content.items() if key in kept}
    for key, sub in rules.nested.get(etype, {}).items():
        value = content.get(key)
        if isinstance(value, dict):
            pruned[key] = {k: v for k, v in value.items() if k in sub}
    out["content"] = pruned
    return out


def _check(value: Any, strict: bool) -> Any:
    """*value* ready for the JSON encoder: raises :class:`CanonicalJsonError` for
    what canonical JSON refuses; integral floats become integers under *strict*."""
    kind = type(value)
    if kind is str or value is None or value is True or value is False:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        if strict and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise CanonicalJsonError(f"integer {value} is outside canonical JSON's range")
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalJsonError(f"{value!r} is not a JSON number")
        if not strict:
            return float(value)
        if value.is_integer() and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return int(value)
        raise CanonicalJsonError(f"canonical JSON has no floats: {value!r}")
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalJsonError(f"object key {key!r} is not a string")
            out[str(key)] = _check(item, strict)
        return out
    if isinstance(value, (list, tuple)):
        return [_check(item, strict) for item in value]
    raise CanonicalJsonError(f"{type(value).__name__} is not a JSON value")


def canonical_json(value: Any, strict: bool = True) -> bytes:
    """The canonical JSON of *value* (see the module docstring for numbers)."""
    checked = _check(value, strict)
    try:
        return json.dumps(checked, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                          sort_keys=True).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalJsonError(f"a string is not valid Unicode ({exc.reason})") from None


def content_hash(event: Mapping[str, Any], strict: bool = True) -> bytes:
    """The SHA-256 digest of the event's content hash."""
    hashed = {key: value for key, value in event.items() if key not in CONTENT_HASH_EXCLUDED}
    return hashlib.sha256(canonical_json(hashed, strict)).digest()


def reference_hash(event: Mapping[str, Any], rules: RedactionRules, strict: bool = True) -> bytes:
    """The SHA-256 digest of the event's reference hash (over the pruned event)."""
    pruned = prune(event, rules)
    for key in REFERENCE_HASH_EXCLUDED:
        pruned.pop(key, None)
    return hashlib.sha256(canonical_json(pruned, strict)).digest()


def unpadded_base64(data: bytes, urlsafe: bool = False) -> str:
    """*data* in unpadded Base64, standard or URL-safe alphabet."""
    encoded = base64.urlsafe_b64encode(data) if urlsafe else base64.b64encode(data)
    return encoded.rstrip(b"=").decode("ascii")


def event_id_from_hash(digest: bytes, urlsafe: bool) -> str:
    """The event ID a reference hash gives (room versions 3 on): ``$`` and the hash
    in unpadded Base64, URL-safe from version 4."""
    return "$" + unpadded_base64(digest, urlsafe)


def check_hashes(event_id: str, event: Mapping[str, Any], rules: RedactionRules, strict: bool,
                 urlsafe: bool) -> int:
    """:data:`HASHES_MATCH` when *event_id* is the event's reference hash (in the
    alphabet *urlsafe* names) and its ``hashes.sha256`` is its content hash (padded
    or not), else :data:`BAD_EVENT_ID`, :data:`NO_CONTENT_HASH` or
    :data:`BAD_CONTENT_HASH`, the first that applies; raises
    :class:`CanonicalJsonError` when the event has no canonical JSON."""
    if event_id != event_id_from_hash(reference_hash(event, rules, strict), urlsafe):
        return BAD_EVENT_ID
    hashes = event.get("hashes")
    claimed = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not isinstance(claimed, str):
        return NO_CONTENT_HASH
    if claimed.rstrip("=") != unpadded_base64(content_hash(event, strict)):
        return BAD_CONTENT_HASH
    return HASHES_MATCH


def check_records(records: Iterable[Any], rules: RedactionRules, strict: bool,
                  urlsafe: bool) -> dict[str, int]:
    """:func:`check_hashes` of each record (``event_id``, ``body``, ``rejected``, as
    the event store's validation makes them) not flagged rejected; the ones that do
    not match, with what :func:`check_hashes` found."""
    failed: dict[str, int] = {}
    for record in records:
        if record.rejected:
            continue
        found = check_hashes(record.event_id, record.body, rules, strict, urlsafe)
        if found:
            failed[record.event_id] = found
    return failed


def sha256(data: bytes) -> bytes:
    """The SHA-256 digest of *data*."""
    return hashlib.sha256(data).digest()


def sha256_pair(a: bytes, b: bytes) -> tuple[bytes, bytes]:
    """The SHA-256 digests of *a* and of *b* (the compiled core hashes the two
    together, as it does an event's two hashes)."""
    return sha256(a), sha256(b)


def sha256_blocks(mode: str = "auto") -> str:
    """The compiled core's choice of SHA-256 block function (for tests); here
    hashlib decides for itself, and this says so (``"hashlib"``)."""
    if mode not in ("auto", "portable"):
        raise ValueError(f"mode must be 'auto' or 'portable', not {mode!r}")
    return "hashlib"
