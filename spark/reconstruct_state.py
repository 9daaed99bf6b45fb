"""spark-submit entry point of the bulk state reconstruction job.

    spark-submit --master yarn spark/reconstruct_state.py \
        --input hdfs:///exports/state --output hdfs:///out/state

takes the options of ``streamrep spark reconstruct``. Under spark-submit the
master and resources come from spark-submit; executors need streamrep installed
(see docs/spark.md).
"""

from __future__ import annotations

import sys

from streamrep.cli.spark import reconstruct

if __name__ == "__main__":
    reconstruct.main(args=sys.argv[1:], prog_name="reconstruct_state.py")
