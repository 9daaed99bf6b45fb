"""Parsing database URLs: ``sqlite:///path`` or ``postgresql://...``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qsl

from streamrep.errors import DatabaseConfigError

#: Query parameters streamrep reads itself (and removes before handing a URL to libpq).
OWN_PARAMETERS = frozenset({"pool_size", "busy_timeout_ms", "background_checkpoint",
                            "reconnect_timeout"})
# Of those, the ones that may be 0 (switches).
_SWITCHES = frozenset({"background_checkpoint"})

SQLITE = "sqlite"
POSTGRES = "postgres"


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed database URL.

    ``engine`` is ``"sqlite"`` or ``"postgres"``. For SQLite ``target`` is a file
    path (or ``:memory:``); for PostgreSQL it is the URL handed to libpq, which keeps
    every parameter libpq understands (``options=-csearch_path%3D...``,
    ``application_name``, ``sslmode``...).
    """

    engine: str
    target: str
    pool_size: int
    busy_timeout_ms: int
    original: str
    #: SQLite: checkpoint the WAL from a thread of its own rather than in commits.
    background_checkpoint: bool = True
    #: PostgreSQL: seconds a transaction keeps retrying on new connections after its
    #: connection dropped, before :class:`DatabaseUnavailableError`.
    reconnect_timeout: int = 60

    def redacted(self) -> str:
        """The URL with any password replaced by ``***``, fit for logs and errors."""
        return redact_url(self.original)


def redact_url(url: str) -> str:
    """*url* with the password of its user-info part (if any) hidden."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, host = rest.partition("@")
    if ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    return f"{scheme}://{userinfo}@{host}"


def _split_own_parameters(query: str, url: str) -> tuple[str, dict[str, int]]:
    kept: list[str] = []
    own: dict[str, int] = {}
    for part in query.split("&") if query else []:
        key = part.split("=", 1)[0]
        if key in OWN_PARAMETERS:
            (_, value), = parse_qsl(part, keep_blank_values=True)
            try:
                number = int(value)
            except ValueError:
                raise DatabaseConfigError(
                    f"database URL {redact_url(url)}: {key} must be an integer, not {value!r}"
                ) from None
            if key in _SWITCHES and number not in (0, 1):
                raise DatabaseConfigError(
                    f"database URL {redact_url(url)}: {key} must be 0 or 1, not {number}"
                )
            if number < 1 and key not in _SWITCHES:
                raise DatabaseConfigError(
                    f"database URL {redact_url(url)}: {key} must be at least 1, not {number}"
                )
            own[key] = number
        elif part:
            kept.append(part)
    return "&".join(kept), own


def parse_database_url(url: str) -> DatabaseURL:
    """Parse *url*, raising :class:`DatabaseConfigError` when it cannot work.

    * ``sqlite:////var/lib/streamrep.db`` names the absolute path
      ``/var/lib/streamrep.db``; ``sqlite:///relative.db`` (or ``sqlite:relative.db``)
      is relative to the working directory; ``sqlite:///:memory:`` is a private
      in-memory database.
    * ``postgresql://user@host:5432/db?options=-csearch_path%3Dstreamrep`` (or
      ``postgres://``) goes to libpq as is.
    * Both accept ``pool_size=N`` (PostgreSQL connections kept, default 10) and
      ``busy_timeout_ms=N`` (how long SQLite waits for another process's lock,
      default 5000).
    * SQLite accepts ``background_checkpoint=0`` to leave WAL checkpoints to the
      commits that cross SQLite's threshold (default 1: a thread of the process
      runs them; see :mod:`streamrep.db.checkpoint`).
    * PostgreSQL accepts ``reconnect_timeout=N``: seconds a transaction whose
      connection dropped keeps retrying on new connections (default 60).
    """
    if not isinstance(url, str) or not url:
        raise DatabaseConfigError(f"a database URL must be a non-empty string, not {url!r}")
    base, _, query = url.partition("?")
    rest_query, own = _split_own_parameters(query, url)
    pool_size = own.get("pool_size", 10)
    busy = own.get("busy_timeout_ms", 5000)
    scheme, sep, rest = base.partition(":")
    scheme = scheme.lower()
    if scheme == "sqlite":
        if rest_query or "reconnect_timeout" in own:
            raise DatabaseConfigError(
                f"database URL {url!r}: SQLite takes no parameters but pool_size, "
                f"busy_timeout_ms and background_checkpoint "
                f"(got {rest_query or 'reconnect_timeout'!r})"
            )
        if rest.startswith("//"):
            # As everywhere else: the third slash ends the (empty) host part, so
            # sqlite:///rel.db is relative and sqlite:////abs/path.db absolute.
            rest = rest[2:]
            if rest.startswith("/"):
                rest = rest[1:]
            else:
                raise DatabaseConfigError(
                    f"database URL {url!r}: a host part is not allowed in a SQLite URL; "
                    "write sqlite:////absolute/path.db or sqlite:///relative/path.db"
                )
        if not rest or rest.endswith("/"):
            raise DatabaseConfigError(f"database URL {url!r} names no SQLite database file")
        target = rest if rest == ":memory:" else os.path.normpath(rest)
        return DatabaseURL(SQLITE, target, 1, busy, url,
                           background_checkpoint=bool(own.get("background_checkpoint", 1)))
    if scheme in ("postgresql", "postgres"):
        if "background_checkpoint" in own:
            raise DatabaseConfigError(
                f"database URL {redact_url(url)}: background_checkpoint is a SQLite setting")
        if not rest.startswith("//"):
            raise DatabaseConfigError(
                f"database URL {redact_url(url)}: expected postgresql://[user@]host[:port]/database"
            )
        target = "postgresql:" + rest + (f"?{rest_query}" if rest_query else "")
        return DatabaseURL(POSTGRES, target, pool_size, busy, url,
                           reconnect_timeout=own.get("reconnect_timeout", 60))
    raise DatabaseConfigError(
        f"database URL {redact_url(url)}: unsupported scheme {scheme!r} "
        "(use sqlite:///path or postgresql://...)"
    )
