"""The ``streamrep`` command line.

Each subcommand lives in its own module and is imported only when it runs, so
``streamrep --help`` stays fast and ``streamrep serve`` never imports PySpark.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from streamrep.cli import exits

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
        try:
            command: Any = getattr(importlib.import_module(module_name), attr)
        except ModuleNotFoundError as exc:  # a subcommand whose extra is not installed
            sys.exit(exits.report(exc, f"streamrep {cmd_name}"))
        assert isinstance(command, click.Command)
        return with_log_level(command)

    def invoke(self, ctx: click.Context) -> Any:
        # Operational failures end as one line and a distinct status (streamrep.cli.exits).
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort,
                SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            name = ctx.invoked_subcommand
            sys.exit(exits.report(exc, f"streamrep {name}" if name else "streamrep"))


def _command_name(ctx: click.Context) -> str:
    """``streamrep db repair-sequences``, however the program was started."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["streamrep", *reversed(names)])


def _note_log_level(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        exits.note_log_level(str(value), _command_name(ctx))
    return value


def _set_up_logging(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    from streamrep.logsetup import setup_logging

    exits.note_log_level(value, _command_name(ctx))
    setup_logging(value)


def with_log_level(command: click.Command) -> click.Command:
    """Give *command* (and every subcommand of a group) a ``--log-level`` option: one
    that sets up logging where the command has none, else its own, noted so that a
    failure's traceback is printed only at ``debug``. A command's own option that
    takes any text is made to take the configuration's log levels only."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            with_log_level(sub)
        return command
    own = next((p for p in command.params if p.name == "log_level"), None)
    if own is None:
        command.params.append(click.Option(
            ["--log-level"], type=click.Choice(["debug", "info", "warning", "error"],
                                               case_sensitive=False),
            default="warning", show_default=True, expose_value=False, is_eager=True,
            callback=_set_up_logging, help="Log level (debug also prints tracebacks)."))
    else:
        if own.type is click.STRING:
            from streamrep.config.validation import LOG_LEVELS

            own.type = click.Choice([level.lower() for level in LOG_LEVELS],
                                    case_sensitive=False)
        if own.callback is None:
            own.callback = _note_log_level
    return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamrep")
def main() -> None:
    """Streams, replication and the room DAG store."""
