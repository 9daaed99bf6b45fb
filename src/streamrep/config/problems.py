"""How configuration problems are reported: one line each, naming the key and a fix.

A problem caused by a command-line flag names the flag too, so the person who typed
it knows which of their words is wrong::

    config error: listen (from --listen): 'x' is not an address (expected HOST:PORT); ...
"""

from __future__ import annotations

import difflib
from types import MappingProxyType
from typing import Iterable, Mapping

__all__ = ["FLAG_KEYS", "FLAG_OF_KEY", "Problems", "suggest"]

#: Configuration keys that command-line flags set, by the flag's name.
FLAG_KEYS: Mapping[str, str] = MappingProxyType({
    "--server-name": "server_name",
    "--db": "database",
    "--listen": "listen",
    "--instance-name": "instance_name",
    "--metrics-listen": "metrics_listen",
    "--log-level": "logging.level",
    "--log-format": "logging.format",
    "--tls-cert": "tls.cert",
    "--tls-key": "tls.key",
    "--tls-ca": "tls.ca",
    "--require-client-cert": "tls.require_client_cert",
    "--shared-secret-file": "shared_secret_file",
    "--insecure": "insecure",
    "--redis": "replication.redis.url",
})
#: The flag that sets each configuration key.
FLAG_OF_KEY: Mapping[str, str] = MappingProxyType({key: flag for flag, key in FLAG_KEYS.items()})


class Problems:
    """Collects one line per problem: ``config error: <key>: <what>; <fix>``.

    *flag_keys* maps the keys a flag set to that flag's name, which the line shows.
    *offered* are the keys the running command also takes as flags: a fix may then
    suggest the flag (:meth:`or_flag`), and never when the command has no such flag.
    """

    def __init__(self, flag_keys: Mapping[str, str], offered: Iterable[str] = ()) -> None:
        self.lines: list[str] = []
        self._flag_keys = flag_keys
        self._offered = frozenset(offered)

    def or_flag(self, key: str) -> str:
        """`` or pass --flag`` when the running command takes *key* as a flag, else ""."""
        flag = FLAG_OF_KEY.get(key)
        return f" or pass {flag}" if flag is not None and key in self._offered else ""

    def add(self, key: str, what: str, fix: str) -> None:
        """Record that *key* is wrong because *what*, fixed by *fix*."""
        flag = self._flag_keys.get(key)
        where = f"{key} (from {flag})" if flag else key
        self.lines.append(f"config error: {where}: {what}; {fix}")


def suggest(word: str, choices: Iterable[str]) -> str:
    """``did you mean "x"?`` for the closest of *choices*, else a plain fix."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f'did you mean "{close[0]}"?' if close else "fix the name"
