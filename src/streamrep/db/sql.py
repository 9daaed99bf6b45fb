"""One placeholder style for both engines.

Callers write ``?`` placeholders; SQLite takes them as they are, and for psycopg2
they become ``%s`` (with literal ``%`` doubled). Quoted strings, quoted identifiers
and comments are left alone, so ``'?'`` inside a literal is not a placeholder.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """Rewrite *sql* from ``?`` placeholders to psycopg2's ``%s``."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # doubled quote inside
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i:end + 1].replace("%", "%%"))
            i = end + 1
        elif ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "?":
            out.append("%s")
            i += 1
        elif ch == "%":
            out.append("%%")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)
