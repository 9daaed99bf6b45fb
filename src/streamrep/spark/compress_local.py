"""State compression in one process: the Spark job's pipeline without Spark.

Reads the tables with pyarrow (or streams them out of the database), groups the
trees into units, orders the delta rows by unit in numpy and hands batches of
whole units to :func:`streamrep.spark.compress.compress_units`.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa

from streamrep.spark.compress import (
    UNIT_TOPOLOGY_SCHEMA,
    CompressOptions,
    CompressResult,
    OutputWriter,
    assign_units,
    compress_units,
    finish_output,
)
from streamrep.spark.local import TreeRows, _int64, group_edges, read_columns
from streamrep.spark.options import Source, prepare_output

__all__ = ["compress_local", "load_compress_tables", "unit_topology"]

#: Rows of sorted unit data handed to the core per call.
CHUNK_ROWS = 1_000_000

_COLUMNS = {
    "state_groups": ["id", "room_id", "event_id"],
    "state_group_edges": ["state_group", "prev_state_group"],
    "state_groups_state": ["state_group", "type", "state_key", "event_id"],
    "event_to_state_groups": ["state_group"],
}


def load_compress_tables(source: Source, find_unreferenced: bool) -> dict[str, pa.Table]:
    """The tables compression reads (``event_to_state_groups`` only when asked)."""
    names = list(_COLUMNS)[:3] + (["event_to_state_groups"] if find_unreferenced else [])
    return read_columns(source, {name: _COLUMNS[name] for name in names})


def unit_topology(tables: dict[str, pa.Table]) -> pa.Table:
    """One row per (group, edge) with room, own event and whether it is referenced."""
    groups = tables["state_groups"]
    group_ids, row_group, prev, has_edge = group_edges(tables)
    if "event_to_state_groups" in tables:
        referenced = np.isin(group_ids, _int64(tables["event_to_state_groups"].column("state_group")))
    else:
        referenced = np.ones(len(group_ids), dtype=np.bool_)
    take = pa.array(row_group)
    return pa.table(
        [pa.array(group_ids), pa.array(prev, mask=~has_edge), pa.array(np.ones(len(group_ids), np.bool_)),
         groups.column("room_id").combine_chunks().take(take),
         groups.column("event_id").combine_chunks().take(take), pa.array(referenced)],
        schema=UNIT_TOPOLOGY_SCHEMA,
    )


def compress_local(source: Source, options: CompressOptions) -> CompressResult:
    """Compress every room's state groups into ``options.output`` in this process."""
    prepare_output(options.output, options.overwrite)
    result = CompressResult(options.output)
    clock = time.perf_counter()
    tables = load_compress_tables(source, options.find_unreferenced)
    result.timings["read"] = time.perf_counter() - clock

    clock = time.perf_counter()
    units = assign_units(unit_topology(tables), options.split_threshold)
    trees = units.append_column("root", units.column("unit")).append_column(
        "piece", pa.array(np.zeros(units.num_rows, dtype=np.int32))
    )
    rows = TreeRows(trees, tables["state_groups_state"])
    del tables
    result.timings["units"] = time.perf_counter() - clock

    clock = time.perf_counter()
    os.makedirs(options.output, exist_ok=True)
    writer = OutputWriter(options.output, "part-00000")
    try:
        for chunk in rows.chunks(CHUNK_ROWS):
            produced = compress_units(chunk, options)
            writer.write(produced.tables)
            result.add(pa.table({k: [v] for k, v in produced.report.items()}))
    finally:
        writer.close()
    finish_output(options.output)
    result.timings["compress_verify_write"] = time.perf_counter() - clock
    return result
