"""Helpers shared by the replication subcommands."""

from __future__ import annotations

import click

from streamrep.config import parse_address
from streamrep.errors import ConfigError


def parse_connect(value: str) -> tuple[str, int]:
    """``HOST:PORT`` to a tuple, or a click usage error naming the flag."""
    try:
        address = parse_address(value)
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--connect") from None
    return address.host, address.port
