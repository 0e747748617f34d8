"""The one module that imports the Rust core. Everything else reaches Rust through here, so
the boundary (and its typed stub, `_core.pyi`) stays in one place."""

from __future__ import annotations

from contextshift._core import BlockDecision, Conversation, Counts, Plan, count_items, profiles
from contextshift.errors import InvalidOptions

__all__ = [
    "BlockDecision",
    "Conversation",
    "Counts",
    "Plan",
    "count_items",
    "profile_is_approximate",
    "profile_names",
]


def profile_names() -> list[str]:
    return [name for name, _ in profiles()]


def profile_is_approximate(profile: str) -> bool:
    """Whether `profile` estimates; an unknown profile is an `InvalidOptions` error."""
    for name, approximate in profiles():
        if name == profile:
            return approximate
    raise InvalidOptions([("profile", f"unknown profile {profile!r} (known: {', '.join(profile_names())})")])
