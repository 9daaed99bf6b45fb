"""What the hub knows across its connections, sans-IO (see :class:`HubState`)."""

from __future__ import annotations

from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from streamrep.replication import commands as C
from streamrep.replication.protocol.actions import Action, Close, DisconnectReason, FillGap, Publish, Relay
from streamrep.replication.protocol.hub_peer import HubPeer
from streamrep.replication.protocol.settings import ConnectionSettings

__all__ = ["HubState"]


class HubState:
    """What the hub knows across connections (sans-IO): every writer's published
    position, which streams it can read from its database, who may write what,
    which writer instances are connected, and presence.

    * *readable*: the streams whose rows the hub can read (catch-up, gap
      filling), or a test ``stream -> bool``.
    * *stream_writers*: stream -> the instances configured to write it; a peer
      may send ``RDATA``/``POSITION`` only for a stream it writes, under its own
      ``NAME``. None lets any named peer write any stream (embedding, tests).
    * *own_instances*: writer instances of the hub's own process; no peer may
      speak for them.
    * *stored_token*: ``(stream, instance) -> token``, the largest token of the
      writer that the database holds (writers commit before they announce; see
      :meth:`~streamrep.replication.source.StreamSource.stored_token`). An
      ``RDATA`` or ``POSITION`` past it is refused and the hub's position for the
      writer does not move, so no token can silence a writer and nothing is
      skipped if the database was only behind (the writer reconnects, announces
      again, and the hub fills from the database). It is read only when a token
      passes what was last read, so at most once per read of a busy writer.
    * *row_check*: ``(stream, rdata_commands) -> problem or None``, the stream's
      row format (:meth:`streamrep.streams.StreamSet.check_rows`); a relayed row
      that does not fit closes its peer with ``ERROR``. Without one, rows are
      only checked to be JSON.
    """

    def __init__(
        self,
        server_name: str,
        settings: ConnectionSettings,
        *,
        readable: Callable[[str], bool] | Collection[str] = (),
        stream_writers: Mapping[str, Collection[str]] | None = None,
        own_instances: Collection[str] = ("main",),
        stored_token: Callable[[str, str], int] | None = None,
        row_check: Callable[[str, Sequence[Any]], str | None] | None = None,
    ) -> None:
        self.server_name = server_name
        #: ``SERVER <name>``, encoded once for every greeting
        self.server_line = C.encode_one(C.server(server_name))
        self.row_check = row_check
        self.settings = settings
        if callable(readable):
            self._readable = readable
            listed: Collection[str] = ()
        else:
            listed = frozenset(readable)
            self._readable = listed.__contains__
        self.stream_writers = ({s: frozenset(ws) for s, ws in stream_writers.items()}
                               if stream_writers is not None else None)
        self.own_instances = frozenset(own_instances)
        self.stored_token = stored_token
        self.positions: dict[tuple[str, str], int] = {}
        self.known_streams: dict[str, None] = dict.fromkeys(sorted(listed))
        self.syncing_users: dict[str, set[str]] = {}
        #: every peer, in the order they connected
        self.peers: dict[HubPeer, None] = {}
        self._writer_peers: dict[str, HubPeer] = {}
        self._verified: dict[tuple[str, str], int] = {}
        self._peers_per_host: dict[str, int] = {}
        # Peers not active yet, oldest first: in all, and per address.
        self._pending: dict[HubPeer, None] = {}
        self._pending_per_host: dict[str, dict[HubPeer, None]] = {}

    # --- peers -------------------------------------------------------------------------------

    def admit(self, host: str) -> str | None:
        """Why a new connection from *host* must be refused, or None to accept it."""
        if len(self.peers) >= self.settings.max_connections:
            return f"too many connections (limit {self.settings.max_connections})"
        if self._peers_per_host.get(host, 0) >= self.settings.max_connections_per_host:
            return f"too many connections from {host} (limit {self.settings.max_connections_per_host})"
        return None

    def make_room(self, host: str) -> list[tuple[HubPeer, Close]]:
        """The pending peers to close before a new connection from *host* is
        accepted, oldest first, each with its ``Close``: one per pending limit the
        new connection would exceed (``max_pending_per_host``, then
        ``max_pending_connections``). Call before :meth:`admit`."""
        settings = self.settings
        out: list[tuple[HubPeer, Close]] = []
        mine = self._pending_per_host.get(host)
        while mine and len(mine) >= settings.max_pending_per_host:
            out.append(self._evict(next(iter(mine)), f"from {host}", settings.max_pending_per_host))
        while self._pending and len(self._pending) >= settings.max_pending_connections:
            out.append(self._evict(next(iter(self._pending)), "in all", settings.max_pending_connections))
        return out

    def _evict(self, peer: HubPeer, scope: str, limit: int) -> tuple[HubPeer, Close]:
        self._forget_pending(peer)
        peer.closing(DisconnectReason.PENDING_EVICTED)
        return peer, Close(DisconnectReason.PENDING_EVICTED,
                           f"closed for a new connection: more than {limit} connections {scope} sent no "
                           "REPLICATE, RDATA or POSITION after NAME; the oldest is closed")

    def new_peer(self, label: str, host: str = "", now: float | None = None) -> HubPeer:
        """The session of a connection just accepted (after :meth:`admit`); pending
        until it becomes active (:meth:`peer_active`)."""
        peer = HubPeer(self, label, host, now)
        self.peers[peer] = None
        self._peers_per_host[host] = self._peers_per_host.get(host, 0) + 1
        self._pending[peer] = None
        self._pending_per_host.setdefault(host, {})[peer] = None
        return peer

    def peer_active(self, peer: HubPeer) -> None:
        """*peer* named itself and acted: it no longer counts as pending."""
        self._forget_pending(peer)

    def pending_count(self, host: str | None = None) -> int:
        """Peers not active yet (from *host*, or in all)."""
        if host is None:
            return len(self._pending)
        return len(self._pending_per_host.get(host, ()))

    def _forget_pending(self, peer: HubPeer) -> None:
        if self._pending.pop(peer, 0) is None:
            mine = self._pending_per_host[peer.host]
            del mine[peer]
            if not mine:
                del self._pending_per_host[peer.host]

    def peer_lost(self, peer: HubPeer) -> list[Action]:
        """A connection ended: forget it; its instances' syncing users go too
        (announced to the others as ``CLEAR_USER_SYNC``). Only the first call for a
        peer does anything."""
        self._forget_pending(peer)
        if self.peers.pop(peer, 0) is not None:
            return []
        left = self._peers_per_host.get(peer.host, 1) - 1
        if left > 0:
            self._peers_per_host[peer.host] = left
        else:
            self._peers_per_host.pop(peer.host, None)
        if peer.name is not None and self._writer_peers.get(peer.name) is peer:
            del self._writer_peers[peer.name]
        out: list[Action] = []
        for instance_id in peer.sync_instances:
            self.clear_user_sync(instance_id)
            out.append(Relay(C.encode_one(C.clear_user_sync(instance_id)), "CLEAR_USER_SYNC"))
        return out

    def unattended(self) -> list[tuple[str, str]]:
        """Writers the hub publishes from its database with nobody announcing them: not
        its own (their advances are published as they happen), with no live
        connection, on a stream it can read. A writer that committed and then lost its
        connection (or was refused, or crashed) has its facts published this way."""
        live = self._writer_peers
        writers = self.stream_writers
        out = []
        for stream, instance in self.positions:
            if instance in self.own_instances or not self._readable(stream):
                continue
            if writers is not None and instance not in writers.get(stream, ()):
                continue  # not a writer of this stream: the hub refuses its facts
            peer = live.get(instance)
            if peer is None or peer.closed:
                out.append((stream, instance))
        return out

    def is_writer(self, instance: str) -> bool:
        if self.stream_writers is None:
            return True
        return any(instance in ws for ws in self.stream_writers.values())

    def claim_writer(self, instance: str, peer: HubPeer) -> str | None:
        """Make *peer* the one live connection of writer *instance*; why not, or None."""
        if instance in self.own_instances:
            return f"{instance} is this hub's own instance"
        holder = self._writer_peers.get(instance)
        if holder is not None and holder is not peer and not holder.closed:
            return f"writer {instance} is already connected ({holder.label})"
        self._writer_peers[instance] = peer
        return None

    def may_write(self, peer_name: str | None, stream: str, instance: str) -> str | None:
        """Why a peer named *peer_name* may not send rows or positions of *instance*
        on *stream*, or None when it may."""
        if peer_name is None:
            return f"send NAME before writing {stream}"
        if instance in self.own_instances:
            return f"{instance} is this hub's own instance"
        if instance != peer_name:
            return f"{peer_name} cannot write as {instance}"
        if self.stream_writers is not None and instance not in self.stream_writers.get(stream, ()):
            return f"{instance} is not a configured writer of {stream}"
        return None

    def token_limit(self, stream: str, instance: str, token: int) -> int | None:
        """None when *token* of a writer peer is within what the database holds,
        else the largest token it holds."""
        if self.stored_token is None or not self._readable(stream):
            return None
        key = (stream, instance)
        if token <= self._verified.get(key, -1):
            return None
        stored = self.stored_token(stream, instance)
        self._verified[key] = stored
        return stored if token > stored else None

    # --- streams -----------------------------------------------------------------------------

    def load_positions(self, positions: Iterable[tuple[str, str, int]]) -> None:
        """Writers' persisted positions ``(stream, instance, token)`` (at start-up)."""
        for stream, instance, token in positions:
            self.known_streams.setdefault(stream, None)
            key = (stream, instance)
            self.positions[key] = max(token, self.positions.get(key, token))

    def stream_names(self) -> list[str]:
        return list(self.known_streams)

    def readable(self, stream: str) -> bool:
        """Whether the hub can read *stream*'s rows from its database."""
        return self._readable(stream)

    def writers(self, stream: str) -> list[str]:
        return [inst for (s, inst) in self.positions if s == stream]

    def position_lines(self, stream: str | None = None) -> tuple[bytes, int]:
        """``POSITION`` for every (stream, writer) known (or of one stream), encoded."""
        return C.position_lines((s, i, t, t) for (s, i), t in self.positions.items()
                                 if stream is None or s == stream)

    def publish_rows(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]],
                     new_token: int | None = None) -> list[Action]:
        """Rows ``(token, row_json)`` of a writer (token order): publish those past
        its position, then move it to *new_token* (default: the last row's)."""
        key = (stream, instance)
        self.known_streams.setdefault(stream, None)
        old = self.positions.get(key, 0)
        fresh = [r for r in rows if r[0] > old]
        out: list[Action] = []
        if fresh:
            self.positions[key] = fresh[-1][0]
            out.append(Publish(stream, C.rdata_lines(stream, instance, fresh), len(fresh), "RDATA"))
        last = self.positions.get(key, old)
        if new_token is not None and new_token > last:
            self.positions[key] = new_token
            out.append(Publish(stream, C.encode_one(C.position(stream, instance, last, new_token)), 1,
                               "POSITION"))
        return out

    def writer_advanced(self, stream: str, instance: str, new_token: int) -> list[Action]:
        """A writer of the hub's own process reached *new_token*."""
        key = (stream, instance)
        old = self.positions.get(key, 0)
        if new_token <= old:
            return []
        if not self.readable(stream):
            return self.publish_rows(stream, instance, [], new_token)
        self.known_streams.setdefault(stream, None)
        self.positions[key] = new_token
        return [FillGap(stream, instance, old, new_token)]

    def writer_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> list[Action]:
        """A writer peer's ``POSITION``: fill any gap from the database, then pass it on."""
        key = (stream, instance)
        self.known_streams.setdefault(stream, None)
        readable = self.readable(stream)
        old = self.positions.get(key)
        if old is None:
            # A writer the hub meets for the first time: known from now on, at the
            # start of its rows (or where it says it was, without a database).
            old = self.positions[key] = 0 if readable else prev_token
        if prev_token > old and readable:
            # The position moves now, so rows of this writer later in the same
            # read are relayed after the filled ones and none is published twice.
            self.positions[key] = max(prev_token, new_token)
            return [FillGap(stream, instance, old, prev_token, then_token=new_token)]
        if prev_token > old:
            # No database: pass the gap on for readers to fill themselves.
            self.positions[key] = new_token
            return [Publish(stream, C.encode_one(C.position(stream, instance, prev_token, new_token)), 1,
                            "POSITION")]
        if new_token > old:
            self.positions[key] = new_token
            return [Publish(stream, C.encode_one(C.position(stream, instance, old, new_token)), 1,
                            "POSITION")]
        return []

    def fill_rows(self, gap: FillGap, after: int, rows: Sequence[tuple[int, bytes]]) -> list[Action]:
        """Rows ``(token, row_json)`` read from the database for *gap*, past *after*
        (what this fill published already): published as they are, since the
        writer's position moved when the gap was found."""
        fresh = [r for r in rows if after < r[0] <= gap.upto_token]
        if not fresh:
            return []
        return [Publish(gap.stream, C.rdata_lines(gap.stream, gap.instance, fresh), len(fresh), "RDATA")]

    def fill_done(self, gap: FillGap, last: int) -> list[Action]:
        """The end of a fill whose last published row is *last*: the positions that
        tell readers where the writer is (past rolled-back facts, and on to
        ``then_token``)."""
        out: list[Action] = []
        stream, instance = gap.stream, gap.instance
        if last < gap.upto_token:
            out.append(Publish(stream, C.encode_one(C.position(stream, instance, last, gap.upto_token)), 1,
                               "POSITION"))
        if gap.then_token is not None and gap.then_token > gap.upto_token:
            out.append(Publish(stream, C.encode_one(C.position(stream, instance, gap.upto_token, gap.then_token)),
                               1, "POSITION"))
        return out

    def fill_failed(self, gap: FillGap, last: int) -> None:
        """A fill stopped after publishing up to *last*: the writer's position goes
        back there, so the next announcement fills the rest."""
        key = (gap.stream, gap.instance)
        if self.positions.get(key, last) > last:
            self.positions[key] = last

    def catch_up_behind(self, stream: str, sent: Mapping[str, int], from_token: int) -> list[tuple[str, int]]:
        """Writers of *stream* whose published position is past what a catch-up
        sent them (``sent``: instance -> token), with that position."""
        return [(inst, token) for (s, inst), token in self.positions.items()
                if s == stream and token > sent.get(inst, from_token)]

    def catch_up_positions(self, stream: str, from_token: int, last_row: Mapping[str, int]) -> tuple[bytes, int]:
        """The ``POSITION`` lines that end a catch-up of *stream*: one per writer,
        from the last row sent (or *from_token*) to its position."""
        return C.position_lines(
            (stream, inst, max(from_token, last_row.get(inst, from_token)), token)
            for (s, inst), token in self.positions.items() if s == stream)

    def catch_up_room(self) -> int:
        """The most commands a catch-up must queue at once (its final positions):
        the bound on a connection's queue must be at least this."""
        per_stream: dict[str, int] = {}
        for stream, _inst in self.positions:
            per_stream[stream] = per_stream.get(stream, 0) + 1
        return max([len(self.positions)] + list(per_stream.values()))

    # --- presence ----------------------------------------------------------------------------

    def user_sync(self, instance_id: str, user_id: str, is_syncing: bool) -> None:
        users = self.syncing_users.setdefault(instance_id, set())
        if is_syncing:
            users.add(user_id)
        else:
            users.discard(user_id)
            if not users:
                del self.syncing_users[instance_id]

    def clear_user_sync(self, instance_id: str) -> None:
        self.syncing_users.pop(instance_id, None)

    def all_syncing_users(self) -> set[str]:
        out: set[str] = set()
        for users in self.syncing_users.values():
            out |= users
        return out
