"""What ``tail`` says about its catch-up source: the writers it fetches gaps from,
writers held back while they cannot be reached, and its metrics listener."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from streamrep.cli._common import parse_connect

if TYPE_CHECKING:
    from streamrep.cli._common import PeerSettings
    from streamrep.replication.follower import Stall
    from streamrep.replication.link import ReplicationLink
    from streamrep.replication.sources.http import HttpSource

__all__ = ["StallReport", "describe_writers", "serve_link_metrics"]


def describe_writers(who: str, settings: PeerSettings, source: HttpSource) -> None:
    """Say where gaps are fetched from, and what in homeserver.yaml deserves a word."""
    synapse = settings.synapse
    assert synapse is not None
    writers = ", ".join(f"{name} ({source.where(name)})" for name in sorted(source.writers)) or "none"
    click.echo(f"{who}: {synapse.source}: gaps are fetched over HTTP from {writers}"
               f"{' with the replication secret' if synapse.replication_secret else ''}", err=True)
    for note in synapse.notes:
        click.echo(f"{who}: {synapse.source}: {note}", err=True)


class StallReport:
    """The link's ``on_stall`` and ``on_resume``: one line each on stderr."""

    def __init__(self, who: str) -> None:
        self.who = who

    def stalled(self, stall: Stall) -> None:
        click.echo(f"{self.who}: holding back {stall.stream}/{stall.instance} at token {stall.position} (the "
                   f"writer is at {stall.upto}): {stall.problem}; the other writers go on, and its facts are "
                   "fetched again in the background until it answers (streamrep_replication_client_"
                   "stalled_seconds)", err=True)

    def resumed(self, stall: Stall) -> None:
        click.echo(f"{self.who}: {stall.stream}/{stall.instance} answers again: handed on what it held back; "
                   "following it again", err=True)


def serve_link_metrics(link: ReplicationLink, address: str | None) -> Any:
    """``--metrics-listen HOST:PORT``: the link's metrics on ``/metrics`` (None: none)."""
    if address is None:
        return None
    from streamrep.replication.metrics import serve_metrics

    try:
        host, port = parse_connect(address)
    except click.BadParameter as exc:
        raise click.BadParameter(str(exc.message), param_hint="--metrics-listen") from None
    return serve_metrics(link.metrics, host, port)
