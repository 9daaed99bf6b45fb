"""Every exception streamrep raises on purpose.

Plain Python, importable whether or not the compiled core built. Protocol errors
carry a message fit to send back to the peer in an ``ERROR`` line.
"""

from __future__ import annotations

from typing import Any, Sequence


class StreamrepError(Exception):
    """Base class of streamrep's own errors."""


# --- the wire format ------------------------------------------------------------


class ProtocolError(StreamrepError):
    """A line that cannot be accepted; ``str(exc)`` is fit for an ``ERROR`` line.

    When ``Decoder.feed`` raises one, ``commands`` holds every command decoded
    from that call's data (bad lines are skipped, good ones kept) and ``errors``
    every error of the call, this one first.
    """

    commands: Sequence[Any] = ()
    errors: Sequence[ProtocolError] = ()


class UnknownCommandError(ProtocolError):
    """The first word of a line names no command of the protocol (one a newer peer
    may have added). ``line`` holds the whole line, so a reader can hand it on."""

    def __init__(self, message: str, line: bytes = b"") -> None:
        super().__init__(message)
        self.line = line

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.line))


class MalformedCommandError(ProtocolError):
    """A known command whose arguments do not parse."""


class LineTooLongError(ProtocolError):
    """A line longer than the decoder's ``max_line_length``.

    ``line_prefix`` holds the first bytes of the offending line, for logs.
    """

    def __init__(self, message: str, line_prefix: bytes = b"") -> None:
        super().__init__(message)
        self.line_prefix = line_prefix

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.line_prefix))


class MalformedReplyError(StreamrepError):
    """Redis sent a subscription bytes that are not RESP2 replies."""


# --- databases, streams and stream IDs -----------------------------------------


class DatabaseConfigError(StreamrepError):
    """A database URL or setup that cannot work (e.g. several writers on SQLite)."""


class DatabaseUnavailableError(DatabaseConfigError):
    """The database could not be reached (or kept dropping the connection) for longer
    than the retry budget (``reconnect_timeout``); the message names what failed."""


class DatabaseMissingError(DatabaseConfigError):
    """A process that only reads was given a database that does not exist: it never
    creates one (a typo would otherwise give it an empty database to read)."""


class DeploymentMismatchError(StreamrepError):
    """The database belongs to another deployment (another server name)."""


class WriterLeaseHeldError(StreamrepError):
    """Another live process holds the writer lease of this instance on a stream; the
    message names the holder (host, pid, since when)."""


class WriterLeaseLostError(StreamrepError):
    """This writer's lease expired or was taken over: it must stop writing."""


class SchemaVersionError(StreamrepError):
    """The database schema is newer than this version of streamrep understands."""


class SequenceMismatchError(StreamrepError):
    """A stream's sequence is behind positions or rows already in the database.

    Handing out such IDs would reuse stream IDs; ``streamrep db repair-sequences``
    moves the sequence past every used ID.
    """


class ListenerFailedError(StreamrepError):
    """A position listener of this writer failed (its exception is the cause): the
    writer reserves no further stream ID, since what it commits might never be
    announced."""


class StreamIdError(StreamrepError, ValueError):
    """A stream ID used out of turn: tracked twice, completed twice or never tracked,
    or at or behind the position it should be ahead of."""


class UnknownStreamError(StreamrepError):
    """A stream name that no stream definition carries."""


class NotAWriterError(StreamrepError):
    """An instance tried to write to a stream it is not configured to write."""


# --- catching up ------------------------------------------------------------------


class CatchUpUnavailableError(StreamrepError):
    """A catch-up source could not answer for one writer (unreachable beyond its
    retries, timing out, failing): trying again later may help. ``stream`` and
    ``instance`` name the writer, ``where`` its address; the message says why."""

    def __init__(self, message: str, stream: str = "", instance: str = "", where: str = "") -> None:
        super().__init__(message)
        self.stream = stream
        self.instance = instance
        self.where = where

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.stream, self.instance, self.where))


class CatchUpRefusedError(CatchUpUnavailableError):
    """A writer refused the catch-up source's credentials (the deployment's
    replication secret): trying again cannot help until they change."""


class UnknownWriterError(StreamrepError):
    """A catch-up source does not know where a writer is (an instance its
    configuration does not name): that writer's gaps cannot be filled from it."""


# --- events, the room DAG and state --------------------------------------------


class InvalidEventError(StreamrepError):
    """An event that cannot be persisted (missing or ill-typed fields, bad JSON)."""


class EventNotFoundError(StreamrepError, KeyError):
    """An event ID that is not stored (or is stored only as an outlier where that matters)."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class InvalidTokenError(StreamrepError, ValueError):
    """A pagination or stream token that does not parse."""


class StateCorruptionError(StreamrepError):
    """State group tables that cannot describe a forest of deltas (cycles, missing
    parents, duplicate keys in one delta). The message names the groups."""


class ChangeSetError(StreamrepError):
    """A compression change set whose files do not match its manifest (changed, cut
    short, missing or added): it is refused before anything is written."""


class StateVerificationError(StreamrepError):
    """A reconstructed state differs from the state recomputed by walking its chain.

    ``groups`` lists the state groups that differ."""

    def __init__(self, message: str, groups: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.groups = groups

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.groups))


# --- configuration ---------------------------------------------------------------


class ConfigError(StreamrepError):
    """A configuration file or flag that cannot work; names the key and a fix.

    ``problems`` holds one line per problem found (all of them, not just the
    first); ``str(exc)`` is those lines joined by newlines.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = problems or (message,)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.problems))


class SynapseConfigError(StreamrepError):
    """A reference homeserver's configuration file (``homeserver.yaml``) that cannot
    be followed: ``problems`` holds one line per problem, each naming the key and the
    fix. *file_problem*: the file itself is missing or unreadable."""

    def __init__(self, message: str, problems: tuple[str, ...] = (), file_problem: bool = False) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = problems or (message,)
        self.file_problem = file_problem

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.problems, self.file_problem))
