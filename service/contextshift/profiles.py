"""Tokenizer profiles as callers see them: what each profile is, and which profile a name
(profile or model) resolves to."""

from __future__ import annotations

from dataclasses import dataclass, field

from contextshift import engine
from contextshift.errors import InvalidOptions


@dataclass(frozen=True)
class ProfileInfo:
    name: str
    approximate: bool


@dataclass(frozen=True)
class Resolution:
    """The profile a request counts with, and the model it was resolved from, if any."""

    profile: str
    approximate: bool
    model: str | None = None
    warnings: list[str] = field(default_factory=list)


def list_profiles() -> list[ProfileInfo]:
    return [ProfileInfo(name, approximate) for name, approximate in engine.profiles()]


def resolve(profile: str) -> Resolution:
    """A profile name; an unknown name is an `InvalidOptions` error on field `profile`."""
    for info in list_profiles():
        if info.name == profile:
            return Resolution(info.name, info.approximate)
    known = ", ".join(p.name for p in list_profiles())
    raise InvalidOptions([("profile", f"unknown profile {profile!r} (known: {known})")])
