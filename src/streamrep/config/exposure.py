"""Whether a listening address is open to other machines, and whether that is allowed."""

from __future__ import annotations

import ipaddress

from streamrep.config.model import Address

__all__ = ["exposure_problem", "is_loopback"]


def is_loopback(addr: Address) -> bool:
    """True when *addr* only accepts connections from this machine."""
    if addr.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.host).is_loopback
    except ValueError:
        return False


def exposure_problem(listen: Address, tls_enabled: bool, secret_configured: bool,
                     insecure: bool) -> str | None:
    """Why a hub listening on *listen* would be open to anyone, or None.

    A loopback address only accepts this machine's processes; any other needs TLS
    or the shared secret, unless *insecure* says a firewall already limits who can
    connect.
    """
    if is_loopback(listen) or tls_enabled or secret_configured or insecure:
        return None
    return (f"{listen} accepts connections from other machines, but neither tls nor "
            "shared_secret_file is set, so anyone who can reach it could read every stream "
            "and forge facts; set tls.cert and tls.key, or shared_secret_file, or "
            "`insecure: true` if a firewall already limits who can connect")
