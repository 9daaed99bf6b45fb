"""spark-submit entry point of state compression.

    spark-submit --master yarn spark/compress_state.py \
        --jdbc-url postgresql://synapse@db/synapse --output hdfs:///out/compressed

takes the options of ``streamrep spark compress``. Under spark-submit the
master and resources come from spark-submit; executors need streamrep
installed (see docs/spark.md).
"""

from __future__ import annotations

import sys

from streamrep.cli.spark import compress

if __name__ == "__main__":
    compress.main(args=sys.argv[1:], prog_name="compress_state.py")
