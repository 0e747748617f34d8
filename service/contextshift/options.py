"""Per-request shift options, validated with errors that name the option."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from contextshift.errors import InvalidOptions

MIN_BLOCK_CHARS = 64  # room for the "[Truncated]" suffix and some text; the core agrees


@dataclass(frozen=True)
class ShiftOptions:
    max_block_chars: int = 50_000
    pinned_cap: float = 0.5
    start_on_user: bool = True
    protect_current_input: bool = True

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> ShiftOptions:
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise InvalidOptions([("options", f"must be a mapping, got {type(options).__name__}")])
        known = {f.name for f in fields(cls)}
        violations = [
            (f"options.{key}", f"unknown option (known: {', '.join(sorted(known))})")
            for key in options
            if key not in known
        ]
        values = {key: value for key, value in options.items() if key in known}
        violations += _check(values)
        if violations:
            raise InvalidOptions(violations)
        return cls(**values)


def _check(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    violations = []
    if "max_block_chars" in values:
        v = values["max_block_chars"]
        if isinstance(v, bool) or not isinstance(v, int) or v < MIN_BLOCK_CHARS:
            violations.append(
                ("options.max_block_chars", f"must be an integer >= {MIN_BLOCK_CHARS}, got {v!r}")
            )
    if "pinned_cap" in values:
        v = values["pinned_cap"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
            violations.append(("options.pinned_cap", f"must be a number in [0, 1], got {v!r}"))
    for key in ("start_on_user", "protect_current_input"):
        if key in values and not isinstance(values[key], bool):
            violations.append((f"options.{key}", f"must be a boolean, got {values[key]!r}"))
    return violations
