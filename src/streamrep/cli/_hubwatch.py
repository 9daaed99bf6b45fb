"""What a process connecting to the hub says while it cannot reach it, and when it
gives up (``tail``, ``write``)."""

from __future__ import annotations

import time

import click

from streamrep.cli.exits import CommandFailed, ExitCode

__all__ = ["HubWatch"]


class HubWatch:
    """Says on stderr why the hub cannot be reached (each new reason at once, the same
    one again at most every *quiet* seconds) and decides when to give up."""

    def __init__(self, who: str, give_up_after: float | None = None, quiet: float = 10.0) -> None:
        self.who = who
        self.give_up_after = give_up_after
        self.quiet = quiet
        #: what to say when no reason was reported, and how to fix it
        self.unreachable = "no connection to the hub"
        self.fix = "start the hub (streamrep serve) or fix --connect"
        self.problem: str | None = None
        self.down_since: float | None = time.monotonic()
        self._said: tuple[str, float] | None = None

    def retrying(self, problem: str, delay: float) -> None:
        """The client's ``on_retry``: an attempt failed or the connection was lost."""
        now = time.monotonic()
        self.problem = problem
        if self.down_since is None:
            self.down_since = now
        if self._said is None or self._said[0] != problem or now - self._said[1] >= self.quiet:
            self._said = (problem, now)
            click.echo(f"{self.who}: {problem}; retrying in {delay:.1f}s", err=True)

    def connected(self) -> None:
        if self.problem is not None:
            click.echo(f"{self.who}: connected", err=True)
        self.problem = None
        self.down_since = None
        self._said = None

    def given_up(self) -> bool:
        return (self.give_up_after is not None and self.down_since is not None
                and time.monotonic() - self.down_since >= self.give_up_after)

    def failure(self, what: str | None = None) -> CommandFailed:
        """The failure to exit with: *what* happened (default: gave up waiting)."""
        what = what or f"gave up after {self.give_up_after:g}s"
        problem = self.problem or self.unreachable
        if "says it is" in problem:
            return CommandFailed(ExitCode.WRONG_SERVER, f"{what}: {problem}; pass the hub's "
                                 "name as --server-name (or fix server_name in the "
                                 "configuration)")
        return CommandFailed(ExitCode.HUB_UNREACHABLE, f"{what}: {problem}; {self.fix}")
