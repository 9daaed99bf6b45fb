"""Replication transports: how commands travel between processes, under the
sans-IO protocol (:mod:`streamrep.replication.protocol`).

* :mod:`.tcp_connection`: one socket driven by a session (read loop, writer, keepalive timer);
* :mod:`.tcp_hub`: :class:`~.tcp_hub.ReplicationHub`, the TCP server;
* :mod:`.tcp_client`: :class:`~.tcp_client.TcpLink`, a process's link to the hub;
* :mod:`.redis`: :class:`~.redis.RedisLink`, a process's link through Redis pub/sub, in
  the format every reference deployment uses, with no hub process (each writer
  publishes its own facts); :mod:`.redis_connection` and :mod:`.redis_format` under it.

Each link transport has an ``open_link(settings, roles)`` named in
:data:`streamrep.replication.link.TRANSPORTS`.
"""
