"""Row formats of the streams only the reference implementation (Synapse) serves.

streamrep serves ``events``, ``backfill``, ``caches``, ``account_data``,
``to_device``, ``receipts`` and ``typing`` itself; their row formats are part of
their :class:`~streamrep.streams.StreamDefinition`. A follower of a Matrix
deployment also meets the reference's other streams. It needs their field names,
in order, to read their rows, and nothing else: no table, no writer. Those are
here, one :class:`~streamrep.streams.RowFormat` per stream, with the JSON kinds the
reference declares, as its rows carry them: a boolean it reads from a database
column is a ``flag`` (on SQLite it arrives as the integer 0 or 1), and a string it
reads from a nullable column is ``string|null``. :func:`streamrep.catalogue.row_formats` joins both into one
table, with one format per stream.

``tests/test_interop_reference.py`` checks every name and field against the
reference's own row classes; docs/streams.md lists them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from streamrep.streams.definition import RowFormat

__all__ = ["FORMAT_ONLY_STREAMS"]

_S = "string"

#: Stream name -> row format, for every stream only the reference serves.
FORMAT_ONLY_STREAMS: Mapping[str, RowFormat] = MappingProxyType({
    # A user's presence as the presence writer holds it now.
    "presence": RowFormat.flat(
        ("user_id", _S), ("state", _S), ("last_active_ts", "integer"),
        ("last_federation_update_ts", "integer"), ("last_user_sync_ts", "integer"),
        ("status_msg", "string|null"), ("currently_active", "flag")),
    # A user's presence to send to one remote server.
    "presence_federation": RowFormat.flat(("destination", _S), ("user_id", _S)),
    # A user changed their push rules.
    "push_rules": RowFormat.flat(("user_id", _S)),
    # A pusher was added, changed or removed.
    "pushers": RowFormat.flat(("user_id", _S), ("app_id", _S), ("pushkey", _S),
                              ("deleted", "boolean")),
    # A user's devices changed, or the servers to tell about it are known.
    "device_lists": RowFormat.flat(("user_id", _S), ("is_signature", "boolean"),
                                   ("hosts_calculated", "flag")),
    # Something for the federation sender: ``type`` names the kind of ``data``.
    "federation": RowFormat.flat(("type", _S), ("data", "object")),
    # A profile field changed, or the user joined or left a room.
    "profile_updates": RowFormat.flat(("user_id", _S), ("action", _S),
                                      ("affected_fields", "array|null")),
    # A sticky event was added or changed.
    "sticky_events": RowFormat.flat(("room_id", _S), ("event_id", _S)),
    # A user's subscription to a thread changed.
    "thread_subscriptions": RowFormat.flat(("user_id", _S), ("room_id", _S), ("event_id", _S)),
    # A room's full state arrived after a partial join.
    "un_partial_stated_room": RowFormat.flat(("room_id", _S)),
    # An event's full state is known after a partial join.
    "un_partial_stated_event": RowFormat.flat(("event_id", _S),
                                              ("rejection_status_changed", "boolean")),
    # A piece of media was quarantined or released (``origin`` null: local media).
    "quarantined_media": RowFormat.flat(("origin", "string|null"), ("media_id", _S),
                                        ("quarantined", "flag")),
})
