"""Spark SQL text for the writer's expressions.

Each batch builds dozens of column expressions. Built through PySpark's `Column` API every
function call is a py4j round trip (~1-2 ms each, thousands per batch: seconds of fixed cost per
batch, measured); as SQL text the whole projection is one `selectExpr` call. These helpers
quote identifiers and literals correctly so the text is safe for any column name or schema.
"""

from __future__ import annotations

from collections.abc import Iterable


def ident(name: str) -> str:
    """A quoted identifier: `name`, with backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def path(*parts: str) -> str:
    """A nested field reference: `a`.`b`.`c`."""
    return ".".join(ident(part) for part in parts)


def string(value: str) -> str:
    """A SQL string literal (backslashes and quotes escaped, as Spark's parser expects)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def binary(value: bytes) -> str:
    return "X'" + value.hex().upper() + "'"


def coalesce(expressions: list[str]) -> str:
    if not expressions:
        return "CAST(NULL AS STRING)"
    return expressions[0] if len(expressions) == 1 else f"coalesce({', '.join(expressions)})"


def any_of(conditions: Iterable[str]) -> str:
    items = list(conditions)
    return "(" + " OR ".join(items) + ")" if items else "false"


def all_of(conditions: Iterable[str]) -> str:
    items = list(conditions)
    return "(" + " AND ".join(items) + ")" if items else "true"


def in_list(expression: str, literals: list[str]) -> str:
    return f"{expression} IN ({', '.join(literals)})" if literals else "false"
