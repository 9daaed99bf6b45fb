"""A writer's committed facts, announced on its link: the writer-side counterpart of
the hub's publishing.

A process that writes streams creates one :class:`Announcer` for its
:class:`~streamrep.streams.Streams` and its link. From then on every fact it
commits is read back from the database (exactly the rows readers will read) and
announced, in token order, by one greenlet; the application never encodes a row.

On every new connection the link first announces, for each stream this process
writes, the position the far end last *confirmed* (or, before any confirmation,
the position this process started from); the announcer then announces everything
committed since, so a reader with no database of its own misses nothing the
writer committed while the link was down, and the hub or a reader drops what it
already had. :meth:`Announcer.flush` returns once the far end accepted every fact
committed so far. An error reading the database stops the announcer, and
:meth:`Announcer.flush` and :meth:`Announcer.check` raise it: it is never only
logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

import gevent
import gevent.event
from gevent import Greenlet

from streamrep.errors import StreamrepError
from streamrep.replication.sources import pages
from streamrep.replication.sources.database import DatabaseSource

if TYPE_CHECKING:
    from streamrep.replication.link import ReplicationLink
    from streamrep.streams import Streams

__all__ = ["Announcer", "AnnouncerFailed", "PAGE_ROWS"]

logger = logging.getLogger(__name__)

#: Rows read back from the database per page while announcing.
PAGE_ROWS = 5000


class AnnouncerFailed(StreamrepError):
    """The announcer could not read what it must announce (the cause is chained)."""


class Announcer:
    """Announces on *link* every fact this process commits on *streams* (see the
    module docstring).

    *names* limits the streams announced (default: every served stream this
    instance writes). Creating it registers it as a position listener of
    *streams* and as the source of *link*'s writer positions; create it before
    starting the link.
    """

    def __init__(self, link: ReplicationLink, streams: Streams, names: Iterable[str] | None = None) -> None:
        self.link = link
        self.instance = streams.instance_name
        chosen = list(names) if names is not None else None
        self.source = DatabaseSource(streams, chosen)
        self.keys = [(name, self.instance) for name in self.source.stream_names()
                     if self.instance in streams.writers_of(name)]
        self._streams = streams
        #: where announcing (re)starts before the far end confirmed anything: what
        #: this process found persisted when it started
        self._start = {key: self._committed(key) for key in self.keys}
        #: what was handed to the link on connection number ``_generation``
        self._announced: dict[tuple[str, str], int] = {}
        self._generation = -1
        self._wake = gevent.event.Event()
        self._failure: BaseException | None = None
        self._pump: Greenlet | None = None
        self._stopping = False
        link.writer_positions = self.restart_positions
        link.on_connected = self._wake.set
        streams.add_listener(self._advanced)

    # --- the writer's side -------------------------------------------------------------------

    def _committed(self, key: tuple[str, str]) -> int:
        return int(self._streams.current_token(key[0], key[1]))

    def _advanced(self, stream: str, instance: str, visible: list[int], position: int) -> None:
        """The position listener: wake the pump (never blocks the committing greenlet)."""
        self._wake.set()
        if self._pump is None and not self._stopping:
            self._pump = gevent.spawn(self._run)

    def restart_positions(self) -> list[tuple[str, str, int]]:
        """What a new connection announces first: per stream, the position the far end
        confirmed, else where this process started."""
        out = []
        for key in self.keys:
            confirmed = self.link.confirmed(*key)
            out.append((key[0], key[1], confirmed if confirmed is not None else self._start[key]))
        return out

    def start(self) -> None:
        """Start announcing (also started by the first commit)."""
        if self._pump is None:
            self._stopping = False
            self._pump = gevent.spawn(self._run)
        self._wake.set()

    # --- the pump --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wake.wait()
                self._wake.clear()
                self._announce_all()
        except Exception as exc:
            self._failure = exc
            logger.error("announcing %s's facts stopped: %s", self.instance, exc)

    def _announce_all(self) -> None:
        link = self.link
        for key in self.keys:
            while link.connected and not self._stopping:
                generation = link.connections_made
                if generation != self._generation:
                    # A new connection announced restart_positions() in its greeting.
                    self._generation = generation
                    self._announced = {k: p for s, i, p in self.restart_positions() for k in [(s, i)]}
                if not self._announce_upto(key, generation, self._committed(key)):
                    break

    def _announce_upto(self, key: tuple[str, str], generation: int, target: int) -> bool:
        """Announce *key*'s facts up to *target* on connection *generation*; False when
        that connection is gone (start over) or there is nothing left to announce."""
        link = self.link
        stream, instance = key
        start = self._announced.get(key, self._start[key])
        if start >= target:
            return False
        for rows in pages(self.source, stream, instance, start, target, PAGE_ROWS):
            # Reading the page yielded: announce only on the connection whose
            # greeting this continues, or a reader would take these rows as
            # following a position they do not follow.
            if link.connections_made != generation or not link.announce(stream, instance, rows):
                return False
            start = self._announced[key] = rows[-1][0]
        if start < target:
            # Rolled-back facts at the end: the position moves without rows.
            if link.connections_made != generation or not link.announce_position(stream, instance, start, target):
                return False
            self._announced[key] = target
        return True

    # --- waiting and failing ------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`AnnouncerFailed` if announcing stopped on an error."""
        if self._failure is not None:
            raise AnnouncerFailed(f"announcing {self.instance}'s facts failed: {self._failure}") from self._failure

    def pending(self) -> dict[tuple[str, str], int]:
        """Writers whose committed position the far end has not confirmed yet."""
        out = {}
        for key in self.keys:
            committed = self._committed(key)
            confirmed = self.link.confirmed(*key)
            if confirmed is None or confirmed < committed:
                out[key] = committed
        return out

    def flush(self, timeout: float) -> bool:
        """Wait until the far end accepted every fact committed so far (True) or
        *timeout* passes (False: the link's ``refusal`` or ``problem`` says why).
        Raises :class:`AnnouncerFailed` if announcing failed."""
        self.start()
        with gevent.Timeout(timeout, False):
            while not self.link.refused_credentials:
                self.check()
                if not self.pending():
                    return True
                self._wake.set()
                gevent.sleep(0.005)
        self.check()
        return not self.pending()

    def stop(self) -> None:
        """Stop announcing (the link stays as it is)."""
        self._stopping = True
        self._wake.set()
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.join(2.0)
            pump.kill(block=False)
