"""Replication: the sans-IO protocol, its transports, and the reader's side.

* :mod:`.protocol`: the protocol itself, sans-IO (sessions for a hub's peer, a
  hub's client and a process on a bus; the actions a transport carries out).
* :class:`ReplicationHub` (:mod:`.transport.tcp_hub`): the TCP server that publishes and relays.
* :class:`ReplicationClient` (:mod:`.transport.tcp_client`): what a worker or writer embeds.
* :class:`StreamFollower` (:mod:`.follower`): facts handed to the application, gaps filled.
* :class:`StreamSource`, :class:`MemorySource` (:mod:`.source`): where rows are read.
* :class:`ConnectionSettings` (:mod:`.protocol`): keepalive, queue and peer bounds.
"""

from __future__ import annotations

from streamrep.replication.follower import StreamFollower
from streamrep.replication.protocol import ConnectionSettings, DisconnectReason
from streamrep.replication.source import MemorySource, StreamSource
from streamrep.replication.backoff import Backoff
from streamrep.replication.transport.tcp_client import ReplicationClient
from streamrep.replication.transport.tcp_hub import DEFAULT_PORT, ReplicationHub

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
