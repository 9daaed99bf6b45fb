"""Replication transports: how commands travel between processes.

* :mod:`.redis`: Redis pub/sub, in the format every reference deployment uses, with
  no hub process (each writer publishes its own facts).
"""
