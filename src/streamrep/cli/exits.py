"""Every exit status of the ``streamrep`` commands, and the one-line report of each
failure.

A command that fails for an operational reason (a database that cannot be reached,
a path that does not exist, a hub that refuses, a missing optional extra) prints
one line to stderr naming what failed and how to fix it, and exits with the status
of :class:`ExitCode` that says which kind of failure it was. The traceback is
printed only with ``--log-level debug``. docs/operations.md lists the table.
"""

from __future__ import annotations

import enum
import errno
import importlib.metadata
import logging
import re
import sqlite3
import sys
import traceback
from dataclasses import dataclass

from streamrep.db.retry import is_busy
from streamrep.errors import ChangeSetError
from streamrep.errors import (CatchUpRefusedError, ConfigError, DatabaseConfigError, DatabaseMissingError,
                              DatabaseUnavailableError, DeploymentMismatchError, SynapseConfigError,
                              SchemaVersionError, SequenceMismatchError, StateCorruptionError,
                              StateVerificationError, StreamrepError, WriterLeaseHeldError,
                              WriterLeaseLostError)

__all__ = ["CommandFailed", "ExitCode", "Failure", "describe", "note_log_level", "report"]


class ExitCode(enum.IntEnum):
    """The exit statuses of every ``streamrep`` command."""

    #: done; for checks (``demo``, ``check-config``): everything checked out
    OK = 0
    #: the command ran but did not achieve its end (the demo's check failed, a writer's
    #: facts were persisted but not announced in time)
    FAILED = 1
    #: bad flags or configuration (also click's own usage errors)
    USAGE = 2
    #: the database could not be reached
    DATABASE_UNAVAILABLE = 3
    #: a file or directory that does not exist or cannot be opened
    BAD_PATH = 4
    #: nothing listens at the hub's address, or it refused the connection
    HUB_UNREACHABLE = 5
    #: the hub answered with another server name than the one expected
    WRONG_SERVER = 6
    #: the command needs an optional extra that is not installed
    MISSING_EXTRA = 7
    #: another live process holds this writer's lease
    LEASE_HELD = 8
    #: this writer's lease expired or was taken over while it wrote
    LEASE_LOST = 9
    #: the database's schema or sequences need attention before this command can run
    DATABASE_STATE = 10
    #: state group tables that do not describe a forest of deltas
    STATE_CORRUPT = 11
    #: a reconstructed state differs from the one recomputed to verify it
    STATE_MISMATCH = 12
    #: the hub or Redis refused this process (too many connections, not a writer of the
    #: stream, a token past what the database holds, no right to publish)
    REFUSED = 13
    #: the disk (or the database's size limit) is full; what was committed before is announced
    DISK_FULL = 14
    #: the far end refused this process's credentials (Redis password, shared secret,
    #: client certificate)
    AUTHENTICATION = 15
    #: the database belongs to another deployment (its recorded server name differs)
    DEPLOYMENT_MISMATCH = 16
    #: a compression change set whose files do not match its manifest; nothing was written
    CHANGE_SET_INVALID = 17
    #: the reference homeserver's configuration (``--synapse-config``) cannot be followed:
    #: a key missing or wrong (the line names it and the fix)
    SYNAPSE_CONFIG = 18
    #: a bug in streamrep: the report asks for the traceback
    INTERNAL = 70


@dataclass(frozen=True)
class Failure:
    """What to print (one line) and the status to exit with."""

    code: ExitCode
    message: str


class CommandFailed(StreamrepError):
    """Raised by a command to stop with *code* after printing *message* (one line)."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _one_line(text: object) -> str:
    return re.sub(r"\s*\n\s*", "; ", str(text).strip())


def _extra_providing(module: str) -> str | None:
    """The extra of streamrep's distribution that installs *module*, if any."""
    try:
        requirements = importlib.metadata.requires("streamrep") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9_.-]+).*extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if match and match[1].lower().replace("-", "_") == module.lower().replace("-", "_"):
            return match[2]
    return None


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:  # a chain may loop back
        visited.add(id(seen))
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _is_unreachable_postgres(exc: BaseException) -> bool:
    """A psycopg2 connection that could not be made (the driver is only imported when
    a PostgreSQL database was used)."""
    psycopg2 = sys.modules.get("psycopg2")
    return (psycopg2 is not None and isinstance(exc, psycopg2.OperationalError)
            and getattr(exc, "pgcode", None) is None)


def _disk_full(exc: BaseException) -> str | None:
    """What says the disk (or the database's size limit) is full, in *exc* or its
    causes: SQLite's SQLITE_FULL, PostgreSQL's disk_full (53100), ENOSPC."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:  # a chain may loop back
        visited.add(id(seen))
        if isinstance(seen, sqlite3.OperationalError) and "disk is full" in str(seen):
            return _one_line(seen)
        if getattr(seen, "pgcode", None) == "53100":
            return _one_line(seen)
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return _one_line(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def describe(exc: BaseException, command: str = "streamrep") -> Failure:
    """The one-line report and exit status of *exc*, raised by *command*."""
    if isinstance(exc, CommandFailed):
        return Failure(exc.code, _one_line(exc))
    if isinstance(exc, ConfigError):
        return Failure(ExitCode.USAGE, "; ".join(exc.problems))
    if isinstance(exc, SynapseConfigError):
        return Failure(ExitCode.BAD_PATH if exc.file_problem else ExitCode.SYNAPSE_CONFIG,
                       "; ".join(exc.problems))
    if isinstance(exc, CatchUpRefusedError):
        return Failure(ExitCode.AUTHENTICATION, _one_line(exc))
    if isinstance(exc, DatabaseMissingError):
        return Failure(ExitCode.BAD_PATH, _one_line(exc))
    if isinstance(exc, DeploymentMismatchError):
        return Failure(ExitCode.DEPLOYMENT_MISMATCH, _one_line(exc))
    locked = _cause(exc, sqlite3.OperationalError)
    if locked is not None and is_busy(locked):
        if isinstance(exc, DatabaseUnavailableError):  # it names the lock and the fix
            return Failure(ExitCode.DATABASE_UNAVAILABLE, _one_line(exc))
        return Failure(ExitCode.DATABASE_UNAVAILABLE,
                       f"the SQLite database stayed locked by another process ({_one_line(locked)}); "
                       "retry once the other writer is done, or raise busy_timeout_ms in the URL "
                       "(sqlite:///PATH?busy_timeout_ms=20000)")
    if isinstance(exc, DatabaseUnavailableError):
        return Failure(ExitCode.DATABASE_UNAVAILABLE,
                       f"{_one_line(exc)}; start the database server or fix the URL (--db, or "
                       "database: in the configuration)")
    if _is_unreachable_postgres(exc):
        return Failure(ExitCode.DATABASE_UNAVAILABLE,
                       f"cannot connect to PostgreSQL: {_one_line(exc)}; start the database "
                       "server or fix the URL (--db)")
    full = _disk_full(exc)
    if full is not None:
        return Failure(ExitCode.DISK_FULL,
                       f"the database cannot grow: {full}; free disk space (or raise the database's "
                       "size limit), then run the command again: what was committed before is kept")
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
        return Failure(ExitCode.BAD_PATH, f"cannot open the SQLite database: {_one_line(exc)}; "
                       "check that the path in --db exists and is writable")
    if isinstance(exc, DatabaseConfigError) and _cause(exc, sqlite3.Error) is not None:
        return Failure(ExitCode.BAD_PATH,
                       f"{_one_line(exc)}; check that the file's directory exists and is "
                       "writable, or give another --db sqlite:///PATH")
    if isinstance(exc, WriterLeaseHeldError):
        return Failure(ExitCode.LEASE_HELD, _one_line(exc))  # it names the holder and the fix
    if isinstance(exc, WriterLeaseLostError):
        return Failure(ExitCode.LEASE_LOST, f"{_one_line(exc)}; check that no other process "
                       "runs as this instance, then start it again")
    if isinstance(exc, (SchemaVersionError, SequenceMismatchError)):
        return Failure(ExitCode.DATABASE_STATE, _one_line(exc))
    if isinstance(exc, StateCorruptionError):
        return Failure(ExitCode.STATE_CORRUPT, _one_line(exc))
    if isinstance(exc, StateVerificationError):
        return Failure(ExitCode.STATE_MISMATCH, _one_line(exc))
    if isinstance(exc, ChangeSetError):
        return Failure(ExitCode.CHANGE_SET_INVALID, f"{_one_line(exc)}; nothing was written: "
                       "run `streamrep spark compress` again for a new change set")
    missing = _cause(exc, ModuleNotFoundError)
    if isinstance(missing, ModuleNotFoundError) and missing.name and \
            missing.name.split(".")[0] != "streamrep":  # streamrep's own: a broken install
        module = missing.name.split(".")[0]
        extra = _extra_providing(module)
        fix = (f"pip install 'streamrep[{extra}]'" if extra is not None
               else f"pip install {module}")
        return Failure(ExitCode.MISSING_EXTRA,
                       f"{command} needs {module}, which is not installed; {fix}")
    if isinstance(exc, OSError) and exc.filename is not None and not isinstance(
            exc, ConnectionError):
        return Failure(ExitCode.BAD_PATH, f"{exc.strerror or _one_line(exc)}: {exc.filename}; "
                       "check the path")
    if isinstance(exc, StreamrepError):
        return Failure(ExitCode.FAILED, _one_line(exc))
    return Failure(ExitCode.INTERNAL,
                   f"internal error: {type(exc).__name__}: {_one_line(exc)}; rerun with "
                   "--log-level debug for the traceback and report it")


# The running command's --log-level and name (``streamrep db repair-sequences``),
# noted while its options are parsed.
_running: dict[str, str] = {}


def note_log_level(level: str, command: str | None = None) -> None:
    """Record the ``--log-level`` a command was given (before it sets up logging)."""
    _running["level"] = str(level).upper()
    if command:
        _running["command"] = command


def report(exc: BaseException, command: str = "streamrep") -> ExitCode:
    """Print the one-line report of *exc* to stderr (its traceback too with
    ``--log-level debug``) and return the status to exit with; *command* names the
    command unless its full name was noted."""
    command = _running.get("command", command)
    failure = describe(exc, command)
    if _running.get("level") == "DEBUG" or logging.getLogger().isEnabledFor(logging.DEBUG):
        traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.write(f"{command}: error: {failure.message}\n")
    sys.stderr.flush()
    return failure.code
