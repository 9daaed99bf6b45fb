"""The per-process handle on streams: :class:`Streams` binds a
:class:`~streamrep.streams.StreamSet` to a database and this instance, creating each
stream's ID generator when first used.
"""

from __future__ import annotations

import threading
from typing import Iterable, Mapping, Sequence

from streamrep.db import Database
from streamrep.errors import DatabaseConfigError
from streamrep.idgen import IdGenerator, MultiWriterIdGenerator, PositionListener, make_id_generator
from streamrep.streams import builtin
from streamrep.streams.definition import Stream, StreamDefinition
from streamrep.streams.streamset import StreamSet


class Streams:
    """The streams of *definitions*, bound to *db* as seen by instance *instance_name*.

    *definitions* is the :class:`StreamSet` this process serves (default: the
    built-in streams, :data:`streamrep.streams.builtin.BUILTIN_STREAMS`; a process
    that runs the room DAG store adds its ``events`` and ``backfill``, see
    :func:`streamrep.catalogue.served_streams`). *writers* maps stream names to
    their writer instances (deployment config); streams not named there are written
    by *default_writer* (by default this instance itself, as in a single-process
    deployment). Several writers need PostgreSQL (:class:`DatabaseConfigError` on
    SQLite, raised when the stream is first used, or at once by :meth:`open_all`).
    """

    def __init__(self, db: Database, instance_name: str,
                 writers: Mapping[str, Sequence[str]] | None = None,
                 default_writer: str | None = None, *,
                 definitions: StreamSet | Iterable[StreamDefinition] | None = None) -> None:
        self.db = db
        self.instance_name = instance_name
        self.default_writer = default_writer if default_writer is not None else instance_name
        if definitions is None:
            definitions = builtin.BUILTIN_STREAMS
        self.definitions = (definitions if isinstance(definitions, StreamSet)
                            else StreamSet(definitions))
        self._writers = {name: tuple(ws) for name, ws in (writers or {}).items()}
        self._streams: dict[str, Stream] = {}
        self._listeners: list[PositionListener] = []
        self._lock = threading.RLock()
        for name, ws in self._writers.items():
            if len(ws) > 1:
                db.require_multiple_writers(name, list(ws))

    def names(self) -> list[str]:
        """Names of every stream served, sorted."""
        return list(self.definitions.names())

    def definition(self, name: str) -> StreamDefinition:
        """The definition of stream *name* (:class:`UnknownStreamError` if not served)."""
        return self.definitions.get(name)

    def writers_of(self, name: str) -> tuple[str, ...]:
        """The writer instances of stream *name*."""
        self.definitions.get(name)  # unknown names raise UnknownStreamError
        return self._writers.get(name, (self.default_writer,))

    def get(self, name: str) -> Stream:
        """The stream *name*, creating its ID generator on first use."""
        with self._lock:
            stream = self._streams.get(name)
            if stream is None:
                stream = self._open(self.definitions.get(name))
                self._streams[name] = stream
            return stream

    __getitem__ = get

    def open_all(self, names: Iterable[str] | None = None) -> list[Stream]:
        """Open the named streams (default: all served) now, to fail early."""
        return [self.get(name) for name in (names if names is not None else self.names())]

    def _open(self, definition: StreamDefinition) -> Stream:
        writers = self.writers_of(definition.name)
        if definition.in_memory:
            from streamrep.streams.memory import InMemoryStream

            if not isinstance(definition, InMemoryStream.Definition):
                raise DatabaseConfigError(f"stream {definition.name!r} has no backing tables")
            stream: Stream = InMemoryStream(definition, self.instance_name, writers)
        else:
            if definition.sequence_name is None and len(writers) > 1:
                raise DatabaseConfigError(
                    f"stream {definition.name!r} supports a single writer, "
                    f"not {len(writers)} ({', '.join(writers)})"
                )
            if definition.schema_component is not None:
                self.db.ensure_schema(definition.schema_component)
            id_gen = make_id_generator(self.db, definition.name, self.instance_name, writers,
                                       definition.tables, definition.sequence_name,
                                       negative=definition.negative)
            stream = Stream(definition, self.db, id_gen, writers)
        for listener in self._listeners:
            stream.id_gen.add_listener(listener)
        return stream

    def generator(self, name: str) -> IdGenerator:
        """Stream *name*'s ID generator."""
        return self.get(name).id_gen

    def add_listener(self, listener: PositionListener) -> None:
        """Call ``listener(stream, instance, visible_tokens, position)`` whenever this
        instance's position in any stream advances (one RDATA per visible token)."""
        with self._lock:
            self._listeners.append(listener)
            for stream in self._streams.values():
                stream.id_gen.add_listener(listener)

    def get_updates_since(self, stream: str, instance: str, from_token: int, upto_token: int,
                          limit: int) -> tuple[list[tuple[int, list[object]]], bool]:
        """See :meth:`Stream.get_updates_since`."""
        return self.get(stream).get_updates_since(instance, from_token, upto_token, limit)

    def current_token(self, stream: str, instance: str | None = None) -> int:
        """Writer *instance*'s position in *stream* (the linear position with None)."""
        return self.get(stream).current_token(instance)

    def wait_for_stream_position(self, instance: str, stream: str, position: int,
                                 timeout: float = 30.0) -> bool:
        """Wait (gevent-friendly) until writer *instance* reaches *position* in *stream*."""
        return self.get(stream).id_gen.wait_for_stream_position(instance, stream, position,
                                                                timeout)

    def close(self) -> None:
        """Persist positions and release the generators' private connections."""
        with self._lock:
            for stream in self._streams.values():
                if isinstance(stream.id_gen, MultiWriterIdGenerator):
                    stream.id_gen.close()

    # -- writing the built-in streams ------------------------------------------------

    def add_cache_invalidation(self, cache_name: str, keys: Sequence[object] | None,
                               invalidation_ts_ms: int | None = None) -> int:
        """Append a cache invalidation (``keys=None``: the whole cache); return its token."""
        return builtin.add_cache_invalidation(self.get(builtin.CACHES.name), self.instance_name,
                                              cache_name, keys, invalidation_ts_ms)

    def add_account_data(self, user_id: str, data_type: str, content: Mapping[str, object],
                         room_id: str | None = None) -> int:
        """Set a user's (room) account data of *data_type*; return its token."""
        return builtin.add_account_data(self.get(builtin.ACCOUNT_DATA.name), self.instance_name,
                                        user_id, data_type, content, room_id)

    def send_to_device(self, messages: Sequence[tuple[str, str, Mapping[str, object]]]) -> int:
        """Queue ``(user_id, device_id, message)`` to-device messages as one fact."""
        return builtin.send_to_device(self.get(builtin.TO_DEVICE.name), self.instance_name,
                                      messages)

    def get_device_messages(self, user_id: str, from_token: int,
                            upto_token: int) -> list[tuple[int, str, dict[str, object]]]:
        """To-device messages for *user_id* in ``(from_token, upto_token]`` as
        ``(token, device_id, message)``: what ``to_device`` rows for the user announce."""
        return builtin.get_device_messages(self.db, user_id, from_token, upto_token)

    def add_receipt(self, room_id: str, receipt_type: str, user_id: str, event_id: str,
                    data: Mapping[str, object] | None = None,
                    thread_id: str | None = None) -> int:
        """Record a user's receipt in a room (replacing their previous one)."""
        return builtin.add_receipt(self.get(builtin.RECEIPTS.name), self.instance_name,
                                   room_id, receipt_type, user_id, event_id, data, thread_id)

    def set_typing(self, room_id: str, user_ids: Sequence[str]) -> int:
        """Set who is typing in *room_id* (in memory); return the typing token."""
        from streamrep.streams.memory import InMemoryStream

        stream = self.get(builtin.TYPING.name)
        assert isinstance(stream, InMemoryStream)
        return stream.set_typing(room_id, user_ids)
