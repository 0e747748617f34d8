"""What is wrong with a table read from a TOML file (the server's config file, the model
configurations file, the gateway's `[[upstreams]]`), said the same way by each reader."""

from __future__ import annotations

from collections.abc import Collection


def table_problem(table: object, known: Collection[str], what: str = "keys") -> str | None:
    """Why `table` is not a table whose keys are among `known` (`what` names them), or None."""
    if not isinstance(table, dict):
        return "expected a table"
    unknown = sorted(set(table) - set(known))
    if unknown:
        return f"unknown {what} {', '.join(unknown)} (known: {', '.join(sorted(known))})"
    return None
