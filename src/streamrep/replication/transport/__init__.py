"""Replication transports: how commands travel between processes, under the
sans-IO protocol (:mod:`streamrep.replication.protocol`).

* :mod:`.tcp_connection`: one socket driven by a session (read loop, writer, keepalive timer);
* :mod:`.tcp_hub`: :class:`~.tcp_hub.ReplicationHub`, the TCP server;
* :mod:`.tcp_client`: :class:`~.tcp_client.ReplicationClient`, what workers and writers embed;
* :mod:`.redis`: Redis pub/sub, in the format every reference deployment uses, with
  no hub process (each writer publishes its own facts).
"""
