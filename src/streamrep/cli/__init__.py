"""The ``streamrep`` command line.

Each subcommand lives in its own module and is imported only when it runs, so
``streamrep --help`` stays fast and ``streamrep serve`` never imports PySpark.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

#: subcommand name -> "module:attribute" of its click command or group.
SUBCOMMANDS: dict[str, str] = {
    "check-config": "streamrep.cli.config:check_config",
    "db": "streamrep.cli.db:db",
    "demo": "streamrep.cli.demo:demo",
    "serve": "streamrep.cli.serve:serve",
    "spark": "streamrep.cli.spark:spark",
    "state": "streamrep.cli.state:state",
    "tail": "streamrep.cli.tail:tail",
    "write": "streamrep.cli.write:write",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        command: Any = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamrep")
def main() -> None:
    """Streams, replication and the room DAG store."""
