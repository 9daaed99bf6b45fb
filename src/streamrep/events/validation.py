"""Turning what callers hand to ``persist_events`` into checked event records.

An event is either a mapping holding ``event_id`` beside the event's own fields
(plus optional ``outlier``/``rejected``/``soft_failed`` flags, which are not part
of the event and are not stored in its JSON), or a pair ``(event_id, json_bytes)``,
or a triple ``(event_id, json_bytes, flags)`` with ``flags`` a mapping of those
flags. Bytes are stored exactly as received; a mapping is serialized once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrep import _impl
from streamrep._pure.eventrecord import FLAG_KEYS, EventRecord

if TYPE_CHECKING:
    from streamrep._pure import eventrecord as _eventrecord
else:
    _eventrecord = _impl.load("eventrecord")

__all__ = ["EventRecord", "FLAG_KEYS", "parse_batch", "parse_event"]

#: Validate one ``persist_events`` item; raises :class:`InvalidEventError`.
parse_event = _eventrecord.parse_event

#: Validate a ``persist_events`` batch, each event once (see ``eventrecord``).
parse_batch = _eventrecord.parse_batch
