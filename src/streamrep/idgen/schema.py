"""Tables the stream ID generators keep: ``stream_positions`` and ``stream_sequences``."""

from __future__ import annotations

from streamrep.db import Migration, register_schema

COMPONENT = "idgen"

register_schema(COMPONENT, [
    Migration(
        1,
        sql=[
            # Each writer's persisted position in each stream, so a restarted writer or
            # reader knows where every writer stands.
            "CREATE TABLE IF NOT EXISTS stream_positions ("
            " stream_name TEXT NOT NULL,"
            " instance_name TEXT NOT NULL,"
            " stream_id BIGINT NOT NULL,"
            " PRIMARY KEY (stream_name, instance_name))",
            # Which sequence feeds which multi-writer stream and which tables hold its
            # rows: lets `streamrep db repair-sequences` work from the database alone.
            "CREATE TABLE IF NOT EXISTS stream_sequences ("
            " stream_name TEXT NOT NULL PRIMARY KEY,"
            " sequence_name TEXT NOT NULL,"
            " tables_json TEXT NOT NULL,"
            " negative BOOLEAN NOT NULL)",
        ],
        description="stream_positions and stream_sequences",
    ),
    Migration(
        2,
        sql=[
            # Which instance wrote which tokens of a stream whose rows do not name
            # their writer (streamrep.idgen.ranges).
            "CREATE TABLE IF NOT EXISTS stream_writer_ranges ("
            " stream_name TEXT NOT NULL,"
            " from_token BIGINT NOT NULL,"
            " instance_name TEXT NOT NULL,"
            " PRIMARY KEY (stream_name, from_token))",
        ],
        description="stream_writer_ranges: who wrote the tokens of streams whose rows do not say",
    ),
])
