"""The ``--config`` option of the commands, and the rule that flags override the file.

A command declares ``@config_option`` and builds its :class:`~streamrep.config.Config`
with :func:`config_from_click`, which hands in the program's stream catalogue and
turns every configuration problem into one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping, TypeVar

import click

from streamrep.config import Config, check_ports, load_config
from streamrep.errors import ConfigError

__all__ = ["config_from_click", "config_option", "report_and_exit"]

_F = TypeVar("_F", bound=Callable[..., Any])


def config_option(func: _F) -> _F:
    """Add ``--config FILE`` to a click command (the parameter is ``config_path``)."""
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), default=None,
        envvar="STREAMREP_CONFIG", show_envvar=True,
        help="YAML configuration file; flags given on the command line override it.",
    )(func)


def report_and_exit(exc: ConfigError) -> None:
    """Print every problem of *exc*, one line each, to stderr and exit with status 2."""
    for line in exc.problems:
        click.echo(line, err=True)
    sys.exit(2)


def config_from_click(ctx: click.Context, config_path: str | None,
                      flags: Mapping[str, str], *,
                      check_ports_of: str | None = None,
                      check_own_ports: bool = False) -> Config:
    """Build the Config for a click command: the file, overridden by flags.

    *flags* maps click parameter names to configuration keys, e.g.
    ``{"db": "database", "listen": "listen", "server_name": "server_name"}``. Without
    ``--config`` every flag value counts (its default included); with it, only flags
    actually given on the command line or in the environment override the file.
    On any problem it prints one line per problem and exits with status 2.
    *check_ports_of* names an instance whose listening ports must be free;
    *check_own_ports* checks those of the configuration's own ``instance_name``
    (what ``serve`` binds).
    """
    from streamrep.catalogue import known_streams

    overrides: dict[str, object] = {}
    for param, key in flags.items():
        value = ctx.params.get(param)
        if config_path is not None:
            source = ctx.get_parameter_source(param)
            if source not in (click.core.ParameterSource.COMMANDLINE,
                              click.core.ParameterSource.ENVIRONMENT):
                continue
        overrides[key] = value
    try:
        config = load_config(config_path, overrides, streams=known_streams(),
                             check_ports_of=check_ports_of, flag_keys=flags.values())
        if check_own_ports:
            check_ports(config, config.instance_name)
        return config
    except ConfigError as exc:
        report_and_exit(exc)
        raise  # unreachable: report_and_exit exits
