"""What ``streamrep tail`` prints on stdout: one JSON object per line.

* A row: ``{"stream", "instance", "token", "row"}``; the rows of one fact share
  its token. ``--format raw`` prints ``row`` as the JSON array the stream carries;
  ``--format named`` as an object keyed by the reference's field names
  (:func:`streamrep.catalogue.row_formats`). A row named formats do not fit (a
  stream without a known format, or a row of another shape, from a newer writer
  say) is printed as it came, with ``"unnamed"`` saying why: never dropped.
* A command that carries no fact (``--commands``): ``{"command": NAME, ...}`` with
  the command's fields by name; a command this version does not know has
  ``"line"``, the whole line as it came, and ``"unknown": true``.
"""

from __future__ import annotations

from typing import IO, Any, Mapping

import orjson

from streamrep.replication import commands as C
from streamrep.streams import RowFormat
from streamrep.wire_commands import SPECS

__all__ = ["ROW_STYLES", "TailPrinter"]

#: The choices of ``--format``.
ROW_STYLES = ("raw", "named")


class TailPrinter:
    """Writes rows (and commands) to *out*, flushing after each fact.

    *formats* (stream -> :class:`RowFormat`) names rows; None prints them raw.
    """

    def __init__(self, out: IO[bytes], formats: Mapping[str, RowFormat] | None = None) -> None:
        self.out = out
        self.formats = formats

    def fact(self, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        """One fact: a line per row."""
        formats = self.formats
        if formats is None:
            lines = [orjson.dumps({"stream": stream, "instance": instance, "token": token, "row": row})
                     for row in rows]
        else:
            row_format = formats.get(stream)
            lines = [orjson.dumps(_named(stream, instance, token, row, row_format)) for row in rows]
        self.out.write(b"\n".join(lines) + b"\n")
        self.out.flush()

    def command(self, command: Any) -> None:
        """One command that carries no fact, as it passes."""
        if type(command) is C.UnknownCommand:
            item: dict[str, Any] = {"command": command.NAME, "unknown": True,
                                    "line": command.line.decode("utf-8", "replace")}
        else:
            item = {"command": command.NAME}
            spec = SPECS.get(command.NAME)
            for name in spec.fields if spec is not None else ():
                item[name] = getattr(command, name, None)
        self.out.write(orjson.dumps(item, default=str) + b"\n")
        self.out.flush()


def _named(stream: str, instance: str, token: int, row: Any, row_format: RowFormat | None) -> dict[str, Any]:
    item: dict[str, Any] = {"stream": stream, "instance": instance, "token": token}
    if row_format is None:
        item["row"] = row
        item["unnamed"] = f"no row format for stream {stream!r}"
        return item
    named = row_format.named(row)
    if named is None:
        item["row"] = row
        item["unnamed"] = row_format.misfit(row)
    else:
        item["row"] = named
    return item
