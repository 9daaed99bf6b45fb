"""Whether the ports a process will listen on are free, checked before it starts."""

from __future__ import annotations

import errno
import socket

from streamrep.config.model import Address, Config
from streamrep.config.problems import FLAG_OF_KEY, Problems
from streamrep.errors import ConfigError

__all__ = ["check_ports"]


def _port_problem(addr: Address) -> str | None:
    """Why the hub could not listen on *addr*, or None if it could."""
    try:
        infos = socket.getaddrinfo(addr.host, addr.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"host {addr.host!r} does not resolve ({exc.strerror})"
    family, socktype, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        # The servers set SO_REUSEADDR too, so a port in TIME_WAIT is not "in use".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"{addr} is already in use by another process"
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"{addr.host} is not an address of this machine"
        if exc.errno == errno.EACCES:
            return f"no permission to listen on {addr}"
        return f"cannot listen on {addr} ({exc.strerror})"
    finally:
        sock.close()
    return None


def check_ports(config: Config, instance: str | None = None) -> None:
    """Raise :class:`ConfigError` if a port *instance* will listen on is taken.

    *instance* defaults to the hub's (its replication ``listen`` and ``metrics_listen``);
    another instance's are its ``instance_map`` ``metrics_listen``. Call it before
    starting anything, so a clash is one line rather than a traceback halfway up.
    """
    instance = instance or config.instance_name
    problems = Problems({})
    checks: list[tuple[str, Address]] = []
    if instance == config.instance_name:
        checks.append(("listen", config.listen))
        if config.metrics_listen is not None:
            checks.append(("metrics_listen", config.metrics_listen))
    else:
        entry = config.instance_map.get(instance)
        if entry is not None and entry.metrics_listen is not None:
            checks.append((f"instance_map.{instance}.metrics_listen", entry.metrics_listen))
    for key, addr in checks:
        why = _port_problem(addr)
        if why is not None:
            flag = FLAG_OF_KEY.get(key, "")
            fix = "stop the process using it or choose another port"
            problems.add(key, why, fix + (f" ({flag} HOST:PORT)" if flag else ""))
    if problems.lines:
        raise ConfigError("\n".join(problems.lines), tuple(problems.lines))
