"""How much memory one Spark executor may hold, and the settings that keep it there.

``--executor-memory`` is a bound per process: the JVM (in local mode the driver
and its executor are one JVM) and each Python worker. The JVM's resident size is
its heap plus what lives beside it (class metadata, compiled code, direct
buffers, thread stacks, the collector's own tables), so the heap gets the
bound less an allowance for those, the areas that can grow get caps inside
it, and Spark's sorts and shuffles spill to disk instead of growing the
process. A Python worker compressing a unit holds its delta rows as
integer columns (:data:`WORKER_BYTES_PER_ROW` at the peak), so rooms are split
into units of at most :attr:`ExecutorMemory.worker_rows` rows, and a unit
still above it (one tree too big) is refused with :class:`ConfigError` before
it is read whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamrep.errors import ConfigError

__all__ = ["ExecutorMemory", "parse_size", "DEFAULT_EXECUTOR_MEMORY"]

MIB = 1 << 20
GIB = 1 << 30

#: The default bound per executor process.
DEFAULT_EXECUTOR_MEMORY = "2g"

#: What the JVM holds beside its heap: the caps of
#: :meth:`ExecutorMemory.java_options` (metaspace 256 MiB, compiled code 128
#: MiB, direct buffers 128 MiB) and thread stacks and the rest, plus a sixteenth
#: of the bound for the collector's tables, which grow with the heap (about 7%
#: of it with G1).
JVM_BESIDE_HEAP = 512 * MIB
_METASPACE = 256 * MIB
_CODE_CACHE = 128 * MIB
_DIRECT = 128 * MIB

#: A Python worker before it holds any row: the interpreter, pyarrow, numpy and the core.
WORKER_BASE = 256 * MIB

#: Bytes a Python worker holds per delta row of the unit it compresses, at its
#: peak (interned integer columns, the walker's arrays and the plan).
WORKER_BYTES_PER_ROW = 80

#: The smallest bound (a heap of 448 MiB).
MINIMUM = GIB

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": MIB, "g": GIB, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in a size such as ``2g``, ``1536m``, ``1.5GiB`` or ``2147483648``."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ConfigError(f"{text!r} is not a size: give bytes or a number with k, m, g or t (2g, 1536m)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _megabytes(size: int) -> str:
    return f"{size // MIB}m"


@dataclass(frozen=True)
class ExecutorMemory:
    """The bound, in bytes, on each executor process (the JVM and each Python worker)."""

    total: int

    def __post_init__(self) -> None:
        if self.total < MINIMUM:
            raise ConfigError(f"--executor-memory {self.total / GIB:.2f} GiB is too small: an "
                              f"executor needs at least {MINIMUM // MIB} MiB (its JVM holds "
                              f"{JVM_BESIDE_HEAP // MIB} MiB and more beside its heap)")

    @classmethod
    def parse(cls, text: str) -> "ExecutorMemory":
        return cls(parse_size(text))

    @property
    def beside_heap(self) -> int:
        """What the JVM may hold beside its heap (640 MiB for 2 GiB)."""
        return (JVM_BESIDE_HEAP + self.total // 16) // MIB * MIB

    @property
    def heap(self) -> int:
        """The JVM heap: the bound less what the JVM holds beside it."""
        return (self.total - self.beside_heap) // MIB * MIB

    @property
    def worker_rows(self) -> int:
        """The most delta rows one unit may have for a Python worker to compress it."""
        return (self.total - WORKER_BASE) // WORKER_BYTES_PER_ROW

    @staticmethod
    def worker_holds(rows: int) -> int:
        """Bytes a Python worker holds at its peak compressing a unit of *rows* delta rows."""
        return WORKER_BASE + rows * WORKER_BYTES_PER_ROW

    def java_options(self) -> str:
        """JVM flags capping what lives beside the heap."""
        return (f"-XX:MaxMetaspaceSize={_megabytes(_METASPACE)} "
                f"-XX:ReservedCodeCacheSize={_megabytes(_CODE_CACHE)} "
                f"-XX:MaxDirectMemorySize={_megabytes(_DIRECT)}")

    def spark_conf(self, local: bool) -> dict[str, str]:
        """Spark settings for this bound. In local mode the one JVM is the
        driver's; on a cluster the executors' JVMs get the heap and the
        container gets the allowance beside it as overhead."""
        conf = {
            # Netty's buffers on the heap, where the heap's bound holds them.
            "spark.shuffle.io.preferDirectBufs": "false",
            "spark.network.io.preferDirectBufs": "false",
        }
        if local:
            conf["spark.driver.memory"] = _megabytes(self.heap)
            conf["spark.driver.extraJavaOptions"] = self.java_options()
        else:
            conf["spark.executor.memory"] = _megabytes(self.heap)
            conf["spark.executor.memoryOverhead"] = _megabytes(self.beside_heap)
            conf["spark.executor.extraJavaOptions"] = self.java_options()
        return conf

    def describe(self) -> str:
        return f"{self.total / GIB:.2f} GiB"
