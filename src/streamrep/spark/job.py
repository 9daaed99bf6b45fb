"""The Spark job: full state (or digests) for every wanted state group.

Plan:

1. read ``state_groups``, ``state_group_edges``, ``state_groups_state`` (and
   ``event_to_state_groups`` when restricting by it) from Parquet/CSV files or
   over JDBC with partitioned range reads;
2. the topology (groups left-joined with their edge, plus the wanted flag) goes
   to one task that checks it with the core and finds tree roots by pointer
   jumping (:func:`streamrep.spark.batches.assign_trees`; 16 bytes per group);
3. the delta rows are joined to their tree, repartitioned by ``(root, piece)``
   and sorted within partitions, and ``mapInArrow`` hands batches of whole trees
   to the compiled core (:func:`streamrep.spark.batches.expand_partition`);
4. the result is written as Parquet.

Executors import :mod:`streamrep.spark.batches` from the installed wheel; see
``docs/spark.md`` for getting it there.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from streamrep.errors import ConfigError
from streamrep.spark.memory import DEFAULT_EXECUTOR_MEMORY, ExecutorMemory
from streamrep.spark.options import ReconstructOptions, ReconstructResult, Source, prepare_output
from streamrep.spark.part_files import absolute_uri, reraise_executor_error, write_states
from streamrep.spark.tables import DELTA_ROW_COUNTS_SQL, REQUIRED_TABLES, SCHEMAS, locate_table

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "build_session",
    "find_jdbc_jar",
    "jdbc_connection",
    "libpq_url",
    "read_delta_row_counts",
    "read_spark_tables",
    "reconstruct_spark",
]

log = logging.getLogger("streamrep.spark")

#: Where Debian's libpostgresql-jdbc-java puts the PostgreSQL JDBC driver.
JDBC_JAR_GLOBS = ("/usr/share/java/postgresql.jar", "/usr/share/java/postgresql-*.jar")

#: Read as NULL only for an unquoted empty field: PostgreSQL's CSV NULL. A quoted
#: "" then stays the empty string (Spark would read both as NULL by default).
_CSV_NULL_SENTINEL = "\u0001streamrep-null\u0001"

#: Column the JDBC reads are partitioned on, per table.
_JDBC_PARTITION_COLUMN = {
    "state_groups": "id",
    "state_group_edges": "state_group",
    "state_groups_state": "state_group",
    "event_to_state_groups": "state_group",
}


def find_jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver jar installed by ``libpostgresql-jdbc-java``, if any."""
    for pattern in JDBC_JAR_GLOBS:
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path):
                return path
    return None


def _local_master(master: str) -> bool:
    return master.startswith("local")


def executor_memory_bound(text: str | None) -> ExecutorMemory | None:
    """The bound *text* gives (``--executor-memory``); without one, 2 GiB, or
    None under ``spark-submit``, which sets the executors' memory itself."""
    if text is None and "PYSPARK_GATEWAY_PORT" in os.environ:
        return None
    return ExecutorMemory.parse(text or DEFAULT_EXECUTOR_MEMORY)


def build_session(
    master: str | None = None,
    *,
    app_name: str = "streamrep-reconstruct-state",
    shuffle_partitions: int | None = None,
    jdbc_jar: str | None = None,
    executor_memory: ExecutorMemory | None = None,
    ui: bool = False,
    conf: dict[str, str] | None = None,
) -> "SparkSession":
    """A SparkSession with streamrep's defaults.

    With no master (and not under ``spark-submit``) the job runs in ``local[*]``
    bound to 127.0.0.1 with the UI off. Executors run ``PYSPARK_PYTHON``, which
    defaults to this interpreter so they import the same installed streamrep.
    *executor_memory* bounds each executor process: the JVM's heap and what it
    holds beside it (in local mode, the driver's JVM). It defaults to 2 GiB,
    except under ``spark-submit``, whose own settings then hold (and the
    driver's always come from ``spark-submit``).
    """
    from pyspark.sql import SparkSession

    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is None and not under_submit:
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    effective = master or ""
    if _local_master(effective):
        # Executors and the block manager bind to loopback too.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if executor_memory is None and not under_submit:
        executor_memory = ExecutorMemory.parse(DEFAULT_EXECUTOR_MEMORY)
    if executor_memory is not None:
        for key, value in executor_memory.spark_conf(_local_master(effective)).items():
            if not (under_submit and key.startswith("spark.driver.")):
                builder = builder.config(key, value)
    if shuffle_partitions is None:
        cores = os.cpu_count() or 2
        match = re.fullmatch(r"local\[(\d+)\]", effective)
        if match:
            cores = int(match.group(1))
        shuffle_partitions = max(4, 2 * cores)
    builder = (
        builder.config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
    )
    jar = jdbc_jar or find_jdbc_jar()
    if jar:
        builder = builder.config("spark.jars", jar)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _spark_schema(table: str) -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fields = []
    for f in SCHEMAS[table]:
        kind = LongType() if str(f.type) == "int64" else StringType()
        fields.append(StructField(f.name, kind, True))
    return StructType(fields)


def jdbc_connection(url: str) -> tuple[str, dict[str, str]]:
    """A ``jdbc:postgresql://`` URL and driver properties for a ``postgresql://`` URL."""
    if url.startswith("jdbc:"):
        return url, {"driver": "org.postgresql.Driver"}
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"expected a postgresql:// or jdbc:postgresql:// URL, not {parts.scheme}://")
    host = parts.hostname or "localhost"
    port = parts.port or 5432
    database = parts.path.lstrip("/") or (parts.username or "postgres")
    props = {"driver": "org.postgresql.Driver"}
    if parts.username:
        props["user"] = unquote(parts.username)
    if parts.password:
        props["password"] = unquote(parts.password)
    renamed = {"application_name": "ApplicationName"}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in ("user", "password"):
            props[key] = value
        else:
            props[renamed.get(key, key)] = value
    return f"jdbc:postgresql://{host}:{port}/{database}", props


def libpq_url(url: str) -> str:
    """A ``postgresql://`` URL for a ``jdbc:postgresql://`` one (user and password
    taken from its query); other URLs unchanged."""
    if not url.startswith("jdbc:"):
        return url
    parts = urlsplit(url[len("jdbc:"):])
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    user = params.pop("user", "")
    password = params.pop("password", "")
    auth = ""
    if user:
        auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@"
    rest = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items() if k == "options")
    return f"postgresql://{auth}{parts.netloc}{parts.path}" + (f"?{rest}" if rest else "")


def _jdbc_bounds(url: str, table: str, column: str) -> tuple[int, int, int]:
    import psycopg2

    from streamrep.db.url import parse_database_url

    dsn = parse_database_url(libpq_url(url)).target
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT min({column}), max({column}), count(*) FROM {table}")
        lo, hi, count = cur.fetchone()
    conn.close()
    return int(lo or 0), int(hi or 0), int(count)


def read_spark_tables(
    spark: "SparkSession", source: Source, need_events: bool, jdbc_partitions: int | None = None,
    only: tuple[str, ...] | None = None,
) -> dict[str, "DataFrame"]:
    """The state tables (or *only* those named) as DataFrames, from files or over JDBC."""
    names = list(REQUIRED_TABLES) + (["event_to_state_groups"] if need_events else [])
    if only is not None:
        names = [name for name in names if name in only]
    frames: dict[str, DataFrame] = {}
    if source.input_dir is not None:
        for name in names:
            found = locate_table(source.input_dir, name)
            if found is None:
                raise ConfigError(
                    f"{source.input_dir} has no {name}: expected {name}.csv, {name}.parquet "
                    f"or a {name}/ folder"
                )
            if found.format == "csv":
                frames[name] = (
                    spark.read.schema(_spark_schema(name))
                    .option("header", True)
                    .option("escape", '"')
                    .option("nullValue", _CSV_NULL_SENTINEL)
                    .option("emptyValue", "")
                    .option("mode", "FAILFAST")
                    .csv(found.path)
                )
            else:
                reader = spark.read
                known = _parquet_spark_schema(found.path)
                if known is not None:
                    # Given the schema, Spark skips a job that reads the footers.
                    reader = reader.schema(known)
                frames[name] = reader.parquet(found.path)
        return frames
    assert source.db_url is not None
    jdbc_url, props = jdbc_connection(source.db_url)
    default_parallelism = spark.sparkContext.defaultParallelism
    for name in names:
        column = _JDBC_PARTITION_COLUMN[name]
        lo, hi, count = _jdbc_bounds(source.db_url, name, column)
        parts = jdbc_partitions or max(1, min(4 * default_parallelism, count // 250_000 + 1))
        if count and parts > 1 and hi > lo:
            frames[name] = spark.read.jdbc(
                jdbc_url, name, column=column, lowerBound=lo, upperBound=hi + 1,
                numPartitions=parts, properties={**props, "fetchsize": "50000"},
            )
        else:
            frames[name] = spark.read.jdbc(jdbc_url, name, properties={**props, "fetchsize": "50000"})
    return frames


#: The delta rows of each state group, counted by PostgreSQL: only the counts
#: cross the network (Spark's JDBC reader does not push an aggregate down).
_DELTA_ROW_COUNTS_SQL = f"({DELTA_ROW_COUNTS_SQL}) AS delta_row_counts"


def read_delta_row_counts(spark: "SparkSession", source: Source) -> "DataFrame | None":
    """``(count_group, counted)`` rows of a JDBC *source*, counted in the database;
    None for files, where Spark counts the rows it reads anyway."""
    if source.db_url is None:
        return None
    jdbc_url, props = jdbc_connection(source.db_url)
    return spark.read.jdbc(jdbc_url, _DELTA_ROW_COUNTS_SQL, properties={**props, "fetchsize": "50000"})


def _parquet_spark_schema(path: str) -> str | None:
    """The Spark schema of the Parquet file or folder at *path* as pyarrow reads
    it from one footer, or None when Spark should work it out itself."""
    import pyarrow.dataset as ds

    try:
        schema = ds.dataset(path, format="parquet").schema
    except Exception:  # left for Spark to report
        return None
    kinds = {"int64": "long", "int32": "int", "string": "string", "large_string": "string"}
    if any(str(f.type) not in kinds for f in schema):
        return None
    return ", ".join(f"`{f.name}` {kinds[str(f.type)]}" for f in schema)


def _wanted_column(frames: dict[str, "DataFrame"], groups: "DataFrame", options: ReconstructOptions) -> "DataFrame":
    from pyspark.sql import functions as F

    wanted = F.lit(True)
    if options.groups:
        wanted = wanted & F.col("id").isin(list(options.groups))
    if options.rooms:
        wanted = wanted & F.coalesce(F.col("room_id").isin(list(options.rooms)), F.lit(False))
    if options.referenced_by_events:
        referenced = (
            frames["event_to_state_groups"].select(F.col("state_group").alias("ref_group")).distinct()
        )
        groups = groups.join(referenced, groups["id"] == referenced["ref_group"], "left")
        wanted = wanted & F.col("ref_group").isNotNull()
    return groups.withColumn("wanted", wanted)


#: Up to this many groups in file input, the driver finds the trees itself.
DRIVER_TREES_MAX_GROUPS = 20_000_000


def _driver_trees(source: Source, options: ReconstructOptions) -> "pa.Table | None":
    """The trees of a file input found in this process, or None to use Spark.

    The topology is a few fields per group: reading it with pyarrow and
    pointer jumping with numpy here avoids a join, two shuffles, a Python
    worker and two Spark actions. JDBC input, a restriction by
    ``event_to_state_groups`` (one row per event) and very large forests go
    through Spark instead.
    """
    if source.input_dir is None or options.referenced_by_events:
        return None
    from streamrep.spark.batches import assign_trees
    from streamrep.spark.local import build_topology
    from streamrep.spark.tables import read_table, require_table, table_dataset

    if table_dataset(require_table(source.input_dir, "state_groups")).count_rows() > DRIVER_TREES_MAX_GROUPS:
        return None
    tables = {
        "state_groups": read_table(
            source.input_dir, "state_groups", ["id", "room_id"] if options.rooms else ["id"]
        ),
        "state_group_edges": read_table(source.input_dir, "state_group_edges", ["state_group", "prev_state_group"]),
    }
    return assign_trees(build_topology(tables, options), options.split_threshold)


def reconstruct_spark(
    spark: "SparkSession", source: Source, options: ReconstructOptions,
    jdbc_partitions: int | None = None,
) -> ReconstructResult:
    """Run the job on *spark*; returns counts and phase timings."""
    from pyspark.sql import functions as F

    import pyarrow.compute as pc

    from streamrep.spark import functions as SF

    prepare_output(options.output, options.overwrite)
    result = ReconstructResult(options.output, digest=options.digest)
    clock = time.perf_counter()
    driver_trees = _driver_trees(source, options)
    frames = read_spark_tables(
        spark, source, options.referenced_by_events, jdbc_partitions,
        only=("state_groups_state",) if driver_trees is not None else None,
    )
    if driver_trees is not None:
        # The topology was read and the trees found right here: no Spark job
        # (and no Python worker) for a table of a few fields per group.
        tree_rows = driver_trees.num_rows
        result.wanted_groups = int(pc.sum(driver_trees.column("wanted")).as_py() or 0)
        trees = SF.ordered_trees(spark, driver_trees)
    else:
        groups = frames["state_groups"].select(F.col("id").cast("long"), F.col("room_id"))
        edges = frames["state_group_edges"].select(
            F.col("state_group").cast("long").alias("edge_group"),
            F.col("prev_state_group").cast("long").alias("prev_state_group"),
        )
        topology = _wanted_column(frames, groups, options).join(
            edges, F.col("id") == F.col("edge_group"), "left"
        ).select(F.col("id").alias("state_group"), "prev_state_group", "wanted")

        # One task finds every tree: the topology is small (a few fields per group).
        trees = topology.repartition(1).mapInArrow(
            functools.partial(SF.find_trees, split_threshold=options.split_threshold),
            SF.ddl(SF.TREES_SCHEMA),
        )
        try:
            trees = trees.localCheckpoint(eager=True)
            counts = trees.agg(
                F.count(F.lit(1)).alias("tree_rows"), F.sum(F.col("wanted").cast("long")).alias("wanted")
            ).first()
            tree_rows = int(counts["tree_rows"]) if counts else 0
            result.wanted_groups = int(counts["wanted"] or 0) if counts else 0
        except Exception as exc:  # Py4JJavaError / PythonException from the task
            reraise_executor_error(exc)
    result.timings["trees"] = time.perf_counter() - clock

    clock = time.perf_counter()
    # Each task writes its own part file from the Python worker and reports a
    # row: the output never passes through the JVM.
    written = write_states(SF.sorted_tree_rows(trees, tree_rows, frames["state_groups_state"]),
                           absolute_uri(options.output), options.digest)
    result.rows = int(pc.sum(written.column("rows")).as_py() or 0)
    result.timings["shuffle_expand_write"] = time.perf_counter() - clock
    result.timings["tasks_expand"] = float(pc.sum(written.column("expand_seconds")).as_py() or 0.0)
    result.timings["tasks_write"] = float(pc.sum(written.column("write_seconds")).as_py() or 0.0)

    if options.verify:
        from streamrep.spark.verify import sample_groups, verify_output

        clock = time.perf_counter()
        wanted_df = trees.where(F.col("wanted")).select("state_group").distinct()
        fraction = min(1.0, 4.0 * options.verify / max(1, result.wanted_groups))
        candidates = [
            int(r[0]) for r in wanted_df.sample(fraction=fraction, seed=options.seed).limit(20 * options.verify).collect()
        ]
        if source.db_url is not None:
            source = Source(db_url=libpq_url(source.db_url))
        result.verified = verify_output(source, options, sample_groups(candidates, options.verify, options.seed))
        result.timings["verify"] = time.perf_counter() - clock
    return result
