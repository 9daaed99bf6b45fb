"""Bulk state reconstruction: full state (or a digest) for every state group.

The library the Spark executors import from the installed wheel, and the
single-process mode of the same pipeline. Modules:

* :mod:`streamrep.spark.functions`: the public Spark functions (full states,
  digests and compression plans as DataFrames in the caller's session) and
  the Arrow-batch functions the executors run; the jobs below use them;
* :mod:`streamrep.spark.tables`: the state tables and reading them with pyarrow;
* :mod:`streamrep.spark.batches`: Arrow batches in, the compiled core in the middle;
* :mod:`streamrep.spark.job`: the Spark job (reading CSV/Parquet/JDBC, trees,
  ``mapInArrow``, Parquet out);
* :mod:`streamrep.spark.local`: the same without Spark;
* :mod:`streamrep.spark.verify`: ``--verify N`` by walking chains;
* :mod:`streamrep.spark.export`: the tables out of a database into Parquet.

Importing this package does not import PySpark.
"""

from streamrep.spark.options import ReconstructOptions, ReconstructResult, Source

__all__ = ["ReconstructOptions", "ReconstructResult", "Source"]
