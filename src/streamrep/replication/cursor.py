"""Durable cursors: where a follower is, per writer, kept across its restarts.

A :class:`Cursor` is the token of the last fact the application took from every
``(stream, instance)``, and per stream where a writer it has not met yet starts.
A :class:`CursorStore` keeps one: :class:`CursorFile` in a file, replaced
atomically; :class:`~streamrep.replication.db_cursor.DatabaseCursor` in a table,
inside the transaction of the fact it records.

A :class:`CursorKeeper` opens a link that resumes from its store (``REPLICATE``,
then every writer from its token; a writer the cursor does not know from its
first fact) and saves the cursor as facts are handed on:

* :class:`SaveAfterHandler`: the application's handler is called once per fact,
  and the cursor is saved after it returned, once per read (or at most every
  *save_interval* seconds) and when the link stops. Exactly once across a stop
  (SIGTERM, SIGINT, :meth:`~streamrep.replication.link.LinkBase.stop`); across a
  crash the facts handed on since the last save come again, and none is lost.
* :class:`~streamrep.replication.db_cursor.SaveInTransaction`: the handler writes
  into a database, and the cursor goes into the same transaction: exactly once
  whatever stops the process, a ``SIGKILL`` included.
"""

from __future__ import annotations

import abc
import errno
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol

import gevent
import orjson

from streamrep.errors import StreamrepError

if TYPE_CHECKING:
    from streamrep.replication.follower import Handler, StreamFollower
    from streamrep.replication.link import LinkRoles, LinkSettings, ReplicationLink

__all__ = ["Cursor", "CursorError", "CursorFile", "CursorKeeper", "CursorStore", "SaveAfterHandler"]

#: The version of the cursor file's format.
CURSOR_FORMAT = 1

#: Seconds between two looks at positions that moved without a fact.
WATCH_SECONDS = 1.0


class CursorError(StreamrepError):
    """A cursor that cannot be read or saved; the message names the file and the fix."""


@dataclass
class Cursor:
    """Where a follower is: *positions* ``{(stream, instance): token}`` of the last
    fact taken from each writer (or the position a writer announced with no fact
    since), and *starts* ``{stream: token}`` for writers of a stream that
    *positions* does not name yet (a ``--from TOKEN`` given at the first start)."""

    positions: dict[tuple[str, str], int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_start(cls, start_from: Mapping[Any, int] | None) -> Cursor:
        """The cursor of a follower about to start at *start_from* (a token per
        stream or per ``(stream, instance)``, as :class:`LinkRoles` takes it)."""
        cursor = cls()
        for key, token in (start_from or {}).items():
            if isinstance(key, str):
                cursor.starts[key] = token
            else:
                cursor.positions[(key[0], key[1])] = token
        return cursor

    @classmethod
    def of(cls, follower: StreamFollower) -> Cursor:
        """What *follower* has taken: its positions, and its starts for the writers
        it has not met yet. Only exact between reads (its ``after_read`` hook) or
        once its link stopped."""
        cursor = cls.from_start(follower.start_from)
        cursor.positions.update(follower.taken_positions())
        return cursor

    def start_from(self) -> dict[Any, int]:
        """The link's *start_from* that resumes exactly here. A stream's start
        applies only while no writer of it is known: the follower asks for a stream
        from the lowest token it needs, and a writer met later is followed from its
        first fact (the link's ``new_writers_from=0``)."""
        known = {stream for stream, _instance in self.positions}
        start: dict[Any, int] = {s: t for s, t in self.starts.items() if s not in known}
        start.update(self.positions)
        return start

    def hub_start_from(self, streams: Iterable[str]) -> dict[Any, int]:
        """*start_from* for a follower that resumes through the hub (no database),
        which asks for each stream from one token (``REPLICATE <stream> <token>``,
        the lowest of its writers'): a followed stream the cursor knows no writer of
        starts at 0, so it is asked for too."""
        start = self.start_from()
        known = {stream for stream, _instance in self.positions}
        for stream in streams:
            if stream not in start and stream not in known:
                start[stream] = 0
        return start

    def encode(self) -> bytes:
        by_stream: dict[str, dict[str, int]] = {}
        for (stream, instance), token in sorted(self.positions.items()):
            by_stream.setdefault(stream, {})[instance] = token
        return orjson.dumps({"format": CURSOR_FORMAT, "positions": by_stream, "starts": self.starts},
                            option=orjson.OPT_SORT_KEYS) + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Cursor:
        """Parse :meth:`encode`'s output; ValueError names what is wrong."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != CURSOR_FORMAT:
            raise ValueError(f"not a cursor of format {CURSOR_FORMAT}")
        cursor = cls()
        positions, starts = doc.get("positions", {}), doc.get("starts", {})
        if not isinstance(positions, dict) or not isinstance(starts, dict):
            raise ValueError("positions and starts must be objects")
        for stream, writers in positions.items():
            if not isinstance(writers, dict):
                raise ValueError(f"positions of {stream!r} must be an object")
            for instance, token in writers.items():
                cursor.positions[(stream, instance)] = _token(token, f"{stream}/{instance}")
        for stream, token in starts.items():
            cursor.starts[stream] = _token(token, stream)
        return cursor


def _token(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"the token of {what} is {value!r}, not a non-negative integer")
    return value


class CursorStore(Protocol):
    """Where a cursor is kept."""

    def load(self) -> Cursor | None:
        """The cursor saved last, or None when none was ever saved."""

    def save(self, cursor: Cursor) -> None:
        """Keep *cursor*, durably, replacing the last one (all or nothing)."""

    def describe(self) -> str:
        """Where the cursor is kept, for messages."""


class CursorFile:
    """A cursor in a file of its own (JSON: ``{"format": 1, "positions": {stream:
    {instance: token}}, "starts": {stream: token}}``).

    Saving writes a temporary file in the same directory, fsyncs it, renames it
    over the cursor and fsyncs the directory: after a crash the file holds the
    old cursor or the new one, never a mix, and a save that returned survives a
    power cut. *fsync* False skips both fsyncs (the rename stays atomic across a
    process's crash, not across a power cut).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        self.directory = os.path.dirname(os.path.abspath(self.path))
        #: saves made, for progress reports and benchmarks
        self.saves = 0

    def describe(self) -> str:
        return f"the cursor file {self.path}"

    def load(self) -> Cursor | None:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CursorError(f"cannot read the cursor file {self.path}: {exc.strerror or exc}; "
                              "check the path and its permissions") from exc
        try:
            return Cursor.decode(data)
        except ValueError as exc:
            raise CursorError(f"the cursor file {self.path} is not a streamrep cursor: {exc}; "
                              "give another --cursor file, or move this one away to start afresh") from None

    def save(self, cursor: Cursor) -> None:
        data = cursor.encode()
        fd, temporary = tempfile.mkstemp(prefix=os.path.basename(self.path) + ".", suffix=".tmp",
                                         dir=self.directory)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
        except BaseException:
            with _ignoring(OSError):
                os.unlink(temporary)
            raise
        if self.fsync:
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        self.saves += 1


class _ignoring:
    def __init__(self, kind: type[BaseException]) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> bool:
        return kind is not None and issubclass(kind, self.kind)


class CursorKeeper(abc.ABC):
    """Opens a link that resumes from *store* and keeps the cursor there.

    *start_from* is where to start when the store holds no cursor yet (a token per
    stream or per ``(stream, instance)``; None: from now on); once a cursor was
    saved it is ignored. :attr:`failure` is set when the cursor could not be
    saved: the follower then takes no more facts and the link is stopped.
    """

    def __init__(self, store: CursorStore, *, start_from: Mapping[Any, int] | None = None) -> None:
        self.store = store
        #: the cursor found in the store (None: none yet, the first start)
        self.resumed = store.load()
        self.initial = Cursor.from_start(start_from) if self.resumed is None else self.resumed
        #: why the cursor could not be saved (the link was stopped)
        self.failure: BaseException | None = None
        self.link: ReplicationLink | None = None
        self._watcher: gevent.Greenlet | None = None

    def roles(self, settings: LinkSettings, **roles: Any) -> LinkRoles:
        """The link's roles: *roles* as :class:`LinkRoles` takes them (``source``,
        ``streams``, ``on_gap``...), with the handler, the start and the hooks that
        keep the cursor."""
        from streamrep.catalogue import known_streams
        from streamrep.replication.link import LinkRoles

        start = self.initial.start_from()
        if self.resumed is not None and settings.transport == "tcp" and roles.get("source") is None:
            streams = roles.get("streams")
            start = self.resumed.hub_start_from(streams if streams is not None else known_streams().names())
        return LinkRoles(handler=self.handler(), start_from=start,
                         new_writers_from=0 if self.resumed is not None else None,
                         after_read=self.after_read, after_stop=self.after_stop, **roles)

    def open_link(self, settings: LinkSettings, **roles: Any) -> ReplicationLink:
        """:func:`~streamrep.replication.link.open_link` with :meth:`roles`."""
        from streamrep.replication.link import open_link

        self.starting()
        link = self.link = open_link(settings, self.roles(settings, **roles))
        if link.follower is not None:
            self._watcher = gevent.spawn(self._watch, link.follower)
        return link

    def _watch(self, follower: StreamFollower) -> None:
        """Positions move without any fact too (a writer's ``POSITION``, the first
        ones after connecting): save them every second or so, between reads."""
        while self.failure is None:
            gevent.sleep(WATCH_SECONDS)
            with follower.lock:  # between reads, and between the pages of a background fill
                if not follower.handing_on and not follower.held:
                    self.after_read(follower)

    def check(self) -> None:
        """Raise :attr:`failure`, if the cursor could not be saved."""
        if self.failure is not None:
            raise self.failure

    def _failed(self, exc: BaseException, follower: StreamFollower | None) -> None:
        """Saving failed: take no more facts, and stop the link (from a greenlet of
        its own: this runs in the link's)."""
        if self.failure is None:
            self.failure = exc
        if follower is not None:
            follower.hold()
        link = self.link
        if link is not None:
            gevent.spawn(link.stop)

    def starting(self) -> None:
        """Before the link opens: a first start from given tokens saves them, so a
        crash before the first fact resumes from there too."""
        if self.resumed is None and (self.initial.positions or self.initial.starts):
            self.save_now(self.initial, None)

    @abc.abstractmethod
    def handler(self) -> Handler:
        """The link's handler: the application's, and what records each fact."""

    @abc.abstractmethod
    def after_read(self, follower: StreamFollower) -> None:
        """Every fact of a read was handed on."""

    @abc.abstractmethod
    def save_now(self, cursor: Cursor, follower: StreamFollower | None) -> None:
        """Save *cursor* (a failure sets :attr:`failure` and stops the link)."""

    def after_stop(self, follower: StreamFollower) -> None:
        """The link stopped: save where the follower is."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.kill(block=False)
        if self.failure is None:
            self.save_now(Cursor.of(follower), follower)


class SaveAfterHandler(CursorKeeper):
    """The application's *handler* is called once per fact; the cursor is saved to
    *store* after it returned: at the end of every read (whose facts are then all
    handed on), at most every *save_interval* seconds (0: every read), and when the
    link stops. Within one long read (a catch-up after a restart is one) it is also
    saved every *within_read* facts or *within_read_seconds*, whichever comes first.

    What a crash (``SIGKILL``, a power cut) can repeat: the facts handed on after
    the last save, so at most *within_read* facts or *within_read_seconds* of
    handing on (with a *save_interval*, its worth); nothing is lost. A stop
    (SIGTERM, SIGINT, ``link.stop()``) repeats nothing. A handler that raises has
    its fact come again, as with any link.
    """

    def __init__(self, store: CursorStore, handler: Handler, *, start_from: Mapping[Any, int] | None = None,
                 save_interval: float = 0.0, within_read: int = 1000, within_read_seconds: float = 0.5) -> None:
        super().__init__(store, start_from=start_from)
        self.application_handler = handler
        self.save_interval = save_interval
        self.within_read = within_read
        self.within_read_seconds = within_read_seconds
        #: facts handed on since the last save, and when the first of them was
        self._unsaved = 0
        self._first_unsaved = 0.0
        #: what may be saved at any moment: the positions at the end of the last
        #: read, moved by every fact handed on since
        self._taken = Cursor(dict(self.initial.positions), dict(self.initial.starts))
        self._saved = Cursor(dict(self._taken.positions), dict(self._taken.starts))
        self._last_save = 0.0
        self._timer: gevent.Greenlet | None = None

    def handler(self) -> Handler:
        handler = self.application_handler
        taken = self._taken.positions

        monotonic = time.monotonic

        def take(stream: str, instance: str, token: int, rows: list[Any]) -> None:
            handler(stream, instance, token, rows)
            taken[(stream, instance)] = token
            self._unsaved += 1
            if self._unsaved == 1:
                self._first_unsaved = monotonic()
                return
            if self._unsaved >= self.within_read or monotonic() - self._first_unsaved >= self.within_read_seconds:
                # A long read: what was taken so far (exact at any moment) is saved,
                # no more often than save_interval says.
                if self.failure is None and monotonic() - self._last_save >= self.save_interval:
                    self.save_now(self._taken, None)

        return take

    def after_read(self, follower: StreamFollower) -> None:
        if self.failure is not None:
            return
        now = Cursor.of(follower)
        taken = self._taken
        taken.positions.clear()
        taken.positions.update(now.positions)
        taken.starts = now.starts
        if taken == self._saved:
            return
        wait = self._last_save + self.save_interval - time.monotonic()
        if wait <= 0:
            self.save_now(taken, follower)
        elif self._timer is None:
            self._timer = gevent.spawn_later(wait, self._save_later, follower)

    def _save_later(self, follower: StreamFollower) -> None:
        self._timer = None
        if self.failure is None and self._taken != self._saved:
            self.save_now(self._taken, follower)

    def save_now(self, cursor: Cursor, follower: StreamFollower | None) -> None:
        snapshot = Cursor(dict(cursor.positions), dict(cursor.starts))
        try:
            self.store.save(snapshot)
        except Exception as exc:
            self._failed(_save_error(self.store, exc), follower)
            return
        self._saved = snapshot
        self._last_save = time.monotonic()
        self._unsaved = 0

    def after_stop(self, follower: StreamFollower) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.kill(block=False)
        super().after_stop(follower)


def _save_error(store: CursorStore, exc: Exception) -> BaseException:
    """*exc* as one line naming the store and the fix (ENOSPC keeps its errno)."""
    if isinstance(exc, CursorError):
        return exc
    if isinstance(exc, OSError):
        fix = ("free disk space" if exc.errno == errno.ENOSPC
               else "check the directory exists and is writable")
        error = OSError(exc.errno, f"cannot save {store.describe()}: {exc.strerror or exc}; {fix}, then "
                                   "start again: it resumes from the last cursor saved")
        error.__cause__ = exc
        return error
    return exc
