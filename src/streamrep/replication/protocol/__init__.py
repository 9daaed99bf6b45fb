"""The replication protocol, sans-IO: decoded commands and the time in, actions out.

Nothing here touches a socket, a greenlet, a timer or a database. A transport
(:mod:`streamrep.replication.transport`) decodes what arrives, hands the
commands to a session with the current time, and carries out the actions the
session returns, in order:

* :class:`Send`: queue these encoded lines to this peer (or, on a bus, publish them);
* :class:`Publish`: stream lines for every other peer following the stream (hub);
* :class:`Relay`: a non-stream command for every other peer (hub);
* :class:`Fact`: hand one fact to the application's handler;
* :class:`FillGap`: read a writer's rows between two tokens from the database and
  feed them back (:meth:`FollowerState.gap_facts` on a reader,
  :meth:`HubState.fill_rows` then :meth:`HubState.fill_done` on the hub);
* :class:`GapUnfilled`: a gap with no database to fill it from;
* :class:`CatchUp`: stream a stream's stored rows after a token to this peer (hub);
* :class:`Received`: a command for the application (``USER_IP``, ``LOCK_RELEASED``, ...);
* :class:`Close`: send ``ERROR <error>`` (when given) and close this peer.

Sessions:

* :class:`ClientSession`: a worker's or writer's end of a TCP connection to the hub;
* :class:`HubPeer` (one per connection) over :class:`HubState` (the hub's shared
  positions, who may write what, presence): the hub's end;
* :class:`BusSession`: one process on a shared bus (Redis), where there is no
  hub: every process publishes its own commands, sees everyone else's, answers
  every ``REPLICATE`` with its own positions, ignores its own echoes and fills
  gaps from the database.

Each session binds its ``on_<COMMAND>`` handlers once, for the commands its peer
may send (:func:`streamrep.wire_commands.accepted_from`); anything else is refused
with ``ERROR`` and a close. Keepalive is data (:class:`Keepalive`): the transport
calls :meth:`Session.tick` now and then and reports writes with
:meth:`Session.data_sent`.

One module per concept:

* :mod:`.settings`: :class:`ConnectionSettings`, the one settings object of every transport;
* :mod:`.actions`: the actions above and :class:`DisconnectReason`;
* :mod:`.keepalive`: :class:`Keepalive`, timers as data;
* :mod:`.session`: :class:`Session`, what every session shares;
* :mod:`.reader`: :class:`FollowerState`, a reader's position per writer;
* :mod:`.client`: :class:`ClientSession`;
* :mod:`.hub` and :mod:`.hub_peer`: :class:`HubState` and :class:`HubPeer`;
* :mod:`.bus`: :class:`BusSession`.
"""

from __future__ import annotations

from streamrep.replication.protocol.actions import (
    Action, CatchUp, Close, Confirmed, DisconnectReason, Fact, FillGap, GapUnfilled, Publish, Received, Refused, Relay, Send,
)
from streamrep.replication.protocol.bus import BusSession
from streamrep.replication.protocol.client import ClientSession
from streamrep.replication.protocol.hub import HubState
from streamrep.replication.protocol.hub_peer import HubPeer
from streamrep.replication.protocol.keepalive import Keepalive
from streamrep.replication.protocol.reader import FollowerState, Positions, StartFrom, WriterKey, group_facts
from streamrep.replication.protocol.session import Session
from streamrep.replication.protocol.settings import ConnectionSettings

__all__ = [
    "ConnectionSettings",
    "DisconnectReason",
    "Send",
    "Publish",
    "Relay",
    "Fact",
    "FillGap",
    "GapUnfilled",
    "Refused",
    "Confirmed",
    "CatchUp",
    "Received",
    "Close",
    "Action",
    "Keepalive",
    "Session",
    "FollowerState",
    "ClientSession",
    "HubState",
    "HubPeer",
    "BusSession",
    "group_facts",
    "Positions",
    "StartFrom",
    "WriterKey",
]
