"""What a process with a replication link says while the link is down, and when it
gives up (``tail``, ``write``, ``serve --redis``)."""

from __future__ import annotations

import time

import click

from streamrep.cli.exits import CommandFailed, ExitCode

__all__ = ["LinkWatch"]


class LinkWatch:
    """Says on stderr why the link is down (each new reason at once, the same one again
    at most every *quiet* seconds), decides when to give up, and names the failure.

    *where* names the far end (``the hub at HOST:PORT``, ``Redis URL channel NAME``);
    *fix* is what to do when it cannot be reached at all.
    """

    def __init__(self, who: str, where: str, fix: str, give_up_after: float | None = None,
                 quiet: float = 10.0) -> None:
        self.who = who
        self.where = where
        self.fix = fix
        self.give_up_after = give_up_after
        self.quiet = quiet
        self.problem: str | None = None
        #: the far end's last refusal of this process (its ERROR, a refused password)
        self.refusal: str | None = None
        self.down_since: float | None = time.monotonic()
        self._said: tuple[str, float] | None = None

    def retrying(self, problem: str, delay: float) -> None:
        """The link's ``on_retry``: an attempt failed or the link was lost."""
        now = time.monotonic()
        self.problem = problem
        if self.down_since is None:
            self.down_since = now
        if self._said is None or self._said[0] != problem or now - self._said[1] >= self.quiet:
            self._said = (problem, now)
            click.echo(f"{self.who}: {problem}; retrying in {delay:.1f}s", err=True)

    def connected(self) -> None:
        if self.problem is not None:
            click.echo(f"{self.who}: connected to {self.where}", err=True)
        self.problem = None
        self.down_since = None
        self._said = None

    def given_up(self) -> bool:
        return (self.give_up_after is not None and self.down_since is not None
                and time.monotonic() - self.down_since >= self.give_up_after)

    def failure(self, what: str | None = None, refusal: str | None = None,
                credentials: bool = False) -> CommandFailed:
        """The failure to exit with: *what* happened (default: gave up waiting), and
        the far end's *refusal* of this process if it refused (*credentials*: its
        password or secret)."""
        what = what or f"gave up after {self.give_up_after:g}s"
        refusal = refusal or self.refusal
        problem = self.problem or f"no connection to {self.where}"
        if "says it is" in problem:
            return CommandFailed(ExitCode.WRONG_SERVER, f"{what}: {problem}; pass the hub's "
                                 "name as --server-name (or fix server_name in the "
                                 "configuration)")
        if refusal is not None:
            if credentials:
                return CommandFailed(ExitCode.AUTHENTICATION, f"{what}: {refusal}")
            return CommandFailed(ExitCode.REFUSED, f"{what}: {self.where} refused this process: "
                                 f"{refusal}; see {self.where}'s log for the reason, and fix it there")
        return CommandFailed(ExitCode.HUB_UNREACHABLE, f"{what}: {problem}; {self.fix}")
