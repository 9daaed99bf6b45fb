"""Replication: the sans-IO protocol, its transports, and both ends of a link.

* :func:`open_link` (:mod:`.link`): a process's :class:`ReplicationLink` to the hub
  or through Redis, chosen by its :class:`LinkSettings`; :class:`LinkRoles` says
  what the process does on it.
* :class:`Announcer` (:mod:`.announcer`): a writer's committed facts, announced.
* :class:`StreamFollower` (:mod:`.follower`): a reader's facts handed to the
  application, gaps filled from a catch-up source.
* :class:`ReplicationHub` (:mod:`.transport.tcp_hub`): the TCP server that
  publishes, relays and serves catch-up.
* :mod:`.sources`: where missed rows come from (:class:`StreamSource`,
  :class:`DatabaseSource`, :class:`MemorySource`, :class:`HttpSource`).
* :mod:`.protocol`: the protocol itself, sans-IO; :class:`ConnectionSettings`.
"""

from __future__ import annotations

from streamrep.replication.announcer import Announcer, AnnouncerFailed
from streamrep.replication.backoff import Backoff
from streamrep.replication.follower import StreamFollower
from streamrep.replication.link import LinkRoles, LinkSettings, ReplicationLink, open_link
from streamrep.replication.handlers import StreamHandlers
from streamrep.replication.protocol import ConnectionSettings, DisconnectReason, Positions, StartFrom, WriterKey
from streamrep.replication.sources import CatchUpSource, StreamSource
from streamrep.replication.sources.database import DatabaseSource
from streamrep.replication.sources.http import HttpSource
from streamrep.replication.sources.memory import MemorySource
from streamrep.replication.transport.tcp_hub import DEFAULT_PORT, ReplicationHub

__all__ = [
    "Announcer",
    "AnnouncerFailed",
    "Backoff",
    "CatchUpSource",
    "ConnectionSettings",
    "DEFAULT_PORT",
    "DatabaseSource",
    "DisconnectReason",
    "HttpSource",
    "LinkRoles",
    "LinkSettings",
    "MemorySource",
    "Positions",
    "StartFrom",
    "StreamHandlers",
    "WriterKey",
    "ReplicationHub",
    "ReplicationLink",
    "StreamFollower",
    "StreamSource",
    "open_link",
]
