"""streamrep: append-only streams, stream-ID generators, a room DAG store and the
line-based TCP replication protocol that lets worker processes follow them."""

from __future__ import annotations

__version__ = "0.1.0"
