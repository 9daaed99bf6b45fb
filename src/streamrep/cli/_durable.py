"""``tail --cursor FILE`` and ``tail --sink URL``: a follower that resumes where it
stopped (see :mod:`streamrep.replication.cursor`)."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, Callable, Mapping

import click

from streamrep.cli.exits import CommandFailed, ExitCode, describe

if TYPE_CHECKING:
    from streamrep.replication.cursor import CursorKeeper
    from streamrep.replication.follower import Handler


def open_keeper(cursor_path: str | None, sink_url: str | None, name: str, handler: Handler,
                start_from: Mapping[Any, int], on_fact: Callable[[], None]) -> CursorKeeper | None:
    """The keeper of ``--cursor`` (printing with *handler*) or ``--sink`` (writing
    rows into the database; *on_fact* runs as each fact is taken), or None."""
    if cursor_path is not None and sink_url is not None:
        raise click.UsageError("give --cursor FILE or --sink DATABASE_URL, not both "
                               "(the sink keeps its cursor in its own database)")
    from streamrep.replication.cursor import CursorError

    keeper: CursorKeeper
    try:
        if cursor_path is not None:
            from streamrep.replication.cursor import CursorFile, SaveAfterHandler

            keeper = SaveAfterHandler(CursorFile(cursor_path), handler, start_from=start_from)
        elif sink_url is not None:
            keeper = _sink(sink_url, name, start_from, on_fact)
        else:
            return None
    except CursorError as exc:
        raise CommandFailed(ExitCode.BAD_PATH, str(exc)) from exc
    where = keeper.store.describe()
    if keeper.resumed is not None:
        writers = len(keeper.resumed.positions)
        click.echo(f"tail: resuming from {where} ({writers} writer{'s' if writers != 1 else ''})", err=True)
    else:
        click.echo(f"tail: no cursor yet in {where}; starting {'from --from' if start_from else 'from now on'}",
                   err=True)
    return keeper


def _sink(url: str, name: str, start_from: Mapping[Any, int], on_fact: Callable[[], None]) -> CursorKeeper:
    from streamrep.replication.sink import open_sink

    return open_sink(url, name, start_from=start_from, on_taken=on_fact)


def close_keeper(keeper: CursorKeeper | None) -> None:
    """Close what the keeper opened (the sink's database)."""
    database = getattr(keeper, "database", None)
    if database is not None:
        database.close()


def keeper_failed(keeper: CursorKeeper) -> CommandFailed:
    """The one line (and status) of a cursor that could not be saved."""
    exc = keeper.failure
    assert exc is not None
    if isinstance(exc, OSError):
        code = ExitCode.DISK_FULL if exc.errno == errno.ENOSPC else ExitCode.BAD_PATH
        return CommandFailed(code, exc.strerror or str(exc))
    failure = describe(exc, "tail")
    return CommandFailed(failure.code, f"{failure.message} (writing into {keeper.store.describe()}; "
                                       "the next start resumes after the last fact committed)")
