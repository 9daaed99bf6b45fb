"""TCP replication: the gevent hub, the client workers embed, and their parts.

* :class:`ReplicationHub` (:mod:`.hub`): the server that publishes and relays.
* :class:`ReplicationClient` (:mod:`.client`): what a worker or writer embeds.
* :class:`StreamFollower` (:mod:`.follower`): per-writer positions, sans-IO.
* :class:`StreamSource`, :class:`MemorySource` (:mod:`.source`): where rows are read.
* :class:`ConnectionSettings` (:mod:`.connection`): keepalive and queue bounds.
"""

from __future__ import annotations

from streamrep.replication.client import Backoff, ReplicationClient
from streamrep.replication.connection import ConnectionSettings, DisconnectReason
from streamrep.replication.follower import StreamFollower
from streamrep.replication.hub import DEFAULT_PORT, ReplicationHub
from streamrep.replication.source import MemorySource, StreamSource

__all__ = [
    "Backoff",
    "ConnectionSettings",
    "DEFAULT_PORT",
    "DisconnectReason",
    "MemorySource",
    "ReplicationClient",
    "ReplicationHub",
    "StreamFollower",
    "StreamSource",
]
