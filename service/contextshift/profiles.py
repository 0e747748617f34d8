"""Tokenizer profiles as callers see them: what each profile is, which profile a name (profile or
model) resolves to, the model registry (models.toml), and the process-wide count cache.

A name resolves as: a profile (`heuristic`, `o200k_base`, ..., or `hf:<path to tokenizer.json>`),
else a model in the registry (exact name, then the longest matching prefix). `resolve` refuses
other names; `resolve_request` is the rule of a request that may name both: the profile wins, a
model alone picks its profile, and an unknown model counts with `heuristic` and says so.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

from contextshift import engine
from contextshift.errors import InvalidOptions

DEFAULT_PROFILE = "heuristic"
HF_PREFIX = "hf:"


@dataclass(frozen=True)
class ProfileInfo:
    """One tokenizer profile, for ListTokenizerProfiles."""

    name: str
    approximate: bool
    # "exact" (the model's tokenizer and framing), "text-exact" (tokenizer exact, framing generic),
    # or "approximate".
    exactness: str = "approximate"
    source: str = ""
    licence: str = ""
    vocab_size: int | None = None
    # Framing tokens per message by role (system, user, assistant, tool).
    message_overhead: Mapping[str, int] = field(default_factory=dict)
    # Tokens a participant name adds beyond its text; None when the chat format drops names.
    name_overhead: int | None = None
    # Tokens once per prompt: begin-of-text and reply priming.
    prompt_overhead: int = 0
    image_rule: str = ""
    overhead_source: str = ""
    # Which reasoning sent back the provider counts ("all", "current_turn", "tool_turns"), and
    # where that rule is published.
    reasoning_rule: str = "all"
    reasoning_source: str = ""

    @staticmethod
    def from_description(d: engine.ProfileDescription) -> ProfileInfo:
        return ProfileInfo(
            name=d.name,
            approximate=d.approximate,
            exactness=d.exactness,
            source=d.source,
            licence=d.licence,
            vocab_size=d.vocab_size,
            message_overhead=dict(d.message_overhead),
            name_overhead=d.name_overhead,
            prompt_overhead=d.prompt_overhead,
            image_rule=d.image_rule,
            overhead_source=d.overhead_source,
            reasoning_rule=d.reasoning_rule,
            reasoning_source=d.reasoning_source,
        )


@dataclass(frozen=True)
class ModelEntry:
    """One row of the model registry."""

    match: str  # a model name, or a prefix ending in "*"
    profile: str
    context: int
    max_output: int | None
    source: str


@dataclass(frozen=True)
class ReasoningEntry:
    """One [[reasoning]] row of the registry: a model whose provider keeps other reasoning than
    its profile's rule says."""

    match: str
    rule: str
    source: str


@dataclass(frozen=True)
class Resolution:
    """The profile a request counts with, and the model it was resolved from, if any."""

    profile: str
    approximate: bool
    model: str | None = None
    warnings: list[str] = field(default_factory=list)
    # From the model registry, when the model is in it.
    context_window: int | None = None
    max_output: int | None = None
    # The model's reasoning rule where it is not its profile's (a [[reasoning]] row).
    reasoning: str | None = None


def list_profiles() -> list[ProfileInfo]:
    """Every built-in profile (`hf:<path>` profiles are open-ended and not listed)."""
    return [ProfileInfo.from_description(d) for d in engine.profiles()]


@functools.cache
def _builtin_names() -> frozenset[str]:
    return frozenset(d.name for d in engine.profiles())


@functools.cache
def _registry() -> dict[str, Any]:
    return tomllib.loads(resources.files("contextshift").joinpath("models.toml").read_text(encoding="utf-8"))


@functools.cache
def list_models() -> tuple[ModelEntry, ...]:
    """The model registry shipped with the package (models.toml), in file order."""
    return tuple(
        ModelEntry(
            match=row["match"].lower(),
            profile=row["profile"],
            context=row["context"],
            max_output=row.get("max_output"),
            source=row["source"],
        )
        for row in _registry()["model"]
    )


@functools.cache
def list_reasoning_rules() -> tuple[ReasoningEntry, ...]:
    """The registry's [[reasoning]] rows: models whose provider keeps other reasoning than their
    profile's rule says."""
    return tuple(
        ReasoningEntry(row["match"].lower(), row["rule"], row["source"]) for row in _registry()["reasoning"]
    )


E = TypeVar("E", ModelEntry, ReasoningEntry)


def _lookup(name: str, entries: Sequence[E]) -> E | None:
    """The entry for model `name`: the exact name, else the longest matching prefix; a
    `provider/` prefix is dropped when the full name matches nothing."""
    key = name.strip().lower()
    candidates = [key]
    if "/" in key:
        candidates.append(key.rsplit("/", 1)[1])
    for candidate in candidates:
        exact = [m for m in entries if m.match == candidate]
        if exact:
            return exact[0]
        prefixes = [m for m in entries if m.match.endswith("*") and candidate.startswith(m.match[:-1])]
        if prefixes:
            return max(prefixes, key=lambda m: len(m.match))
    return None


def lookup_model(name: str) -> ModelEntry | None:
    """The registry entry for model `name` (see `_lookup`)."""
    return _lookup(name, list_models())


def reasoning_rule_of(model: str | None) -> str | None:
    """The reasoning rule of model `model` where the registry gives it one (else its profile's
    applies)."""
    entry = _lookup(model, list_reasoning_rules()) if model else None
    return entry.rule if entry else None


def _is_profile_name(name: str) -> bool:
    return name in _builtin_names() or name.startswith(HF_PREFIX)


@functools.lru_cache(maxsize=256)
def _load(profile: str) -> ProfileInfo:
    """The profile, loaded (a vocabulary, a tokenizer.json); `InvalidOptions` when it cannot be.
    Cached like the core's loaded profiles: a served request resolves its profile twice (for the
    budget, then in `shift_context`), and the description need not be rebuilt each time."""
    return ProfileInfo.from_description(engine.describe_profile(profile))


def _for_model(name: str, entry: ModelEntry) -> Resolution:
    """The registry's profile for a model; a profile that cannot load here (the Llama 3 file not
    configured) falls back to `heuristic` with a warning rather than failing the request."""
    warnings: list[str] = []
    try:
        info = _load(entry.profile)
    except InvalidOptions as e:
        reason = "; ".join(v.description for v in e.violations)
        warnings.append(
            f"model {name!r} counts with {entry.profile}, unavailable here ({reason}); using {DEFAULT_PROFILE} (approximate)"
        )
        info = _load(DEFAULT_PROFILE)
    return Resolution(
        info.name, info.approximate, name, warnings, entry.context, entry.max_output, reasoning_rule_of(name)
    )


def resolve(profile_or_model: str) -> Resolution:
    """A profile name or a model in the registry; anything else is `InvalidOptions` on field
    `profile` (a caller who names a profile wants that profile, not a guess)."""
    if _is_profile_name(profile_or_model):
        info = _load(profile_or_model)
        return Resolution(info.name, info.approximate)
    entry = lookup_model(profile_or_model)
    if entry is None:
        known = ", ".join(sorted(_builtin_names()))
        raise InvalidOptions(
            [
                (
                    "profile",
                    f"unknown profile or model {profile_or_model!r} (profiles: {known}, "
                    f"or {HF_PREFIX}<path to tokenizer.json>; models: see contextshift.profiles.list_models())",
                )
            ]
        )
    return _for_model(profile_or_model, entry)


def resolve_request(profile: str | None = None, model: str | None = None) -> Resolution:
    """The profile of a request that may name a profile, a model, both or neither: the profile
    wins (an unknown one is an error), a model alone picks its registry profile, an unknown model
    counts with `heuristic` (approximate) and says so, and neither means `heuristic`. The model,
    when given, is kept for its registry figures and for calibration."""
    entry = lookup_model(model) if model else None
    if profile:
        resolved = resolve(profile)
        if model is None:
            return resolved
        return Resolution(
            resolved.profile,
            resolved.approximate,
            model,
            resolved.warnings,
            entry.context if entry else resolved.context_window,
            entry.max_output if entry else resolved.max_output,
            reasoning_rule_of(model),
        )
    if model:
        if entry is not None:
            return _for_model(model, entry)
        fallback = _load(DEFAULT_PROFILE)
        warning = (
            f"model {model!r} is not in the model registry; counting with {DEFAULT_PROFILE} (approximate)"
        )
        return Resolution(
            fallback.name, fallback.approximate, model, [warning], reasoning=reasoning_rule_of(model)
        )
    return resolve(DEFAULT_PROFILE)


def count_tokens(
    texts_or_blocks: Sequence[str | Mapping[str, Any]],
    profile: str | None = None,
    *,
    model: str | None = None,
) -> list[int]:
    """Tokens of each item: a str counts as text, a block dict as a whole block (with overhead; its
    reasoning as the provider's rule counts it in a conversation of that block alone). `profile`
    is a profile or model name, `model` a model name (unknown: `heuristic`); neither means
    `heuristic`."""
    resolution = resolve_request(profile, model)
    return engine.count_items(texts_or_blocks, resolution.profile, resolution.reasoning)


@dataclass(frozen=True)
class CacheStats:
    """A process-wide cache (counts, or blocks read from JSON), shared by every shift and count
    of this process."""

    hits: int
    misses: int
    entries: int
    capacity_bytes: int

    @property
    def hit_ratio(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


def cache_stats() -> CacheStats:
    return CacheStats(*engine.count_cache_stats())


def configure_cache(capacity_bytes: int) -> None:
    """Sets the count cache's memory bound (default 64 MiB, or `CONTEXTSHIFT_COUNT_CACHE_BYTES`
    at start); 0 turns caching off."""
    if capacity_bytes < 0:
        raise InvalidOptions([("capacity_bytes", f"must be >= 0, got {capacity_bytes}")])
    engine.configure_count_cache(capacity_bytes)


def clear_cache() -> None:
    """Empties the count cache and the block cache (with the requests it keeps)."""
    engine.clear_count_cache()


def block_cache_stats() -> CacheStats:
    """The block cache: blocks read from JSON text, looked up by that text when it comes again
    (a block taken from a recent request whose bytes a new one starts with counts as a hit)."""
    return CacheStats(*engine.block_cache_stats())


def configure_block_cache(capacity_bytes: int) -> None:
    """Sets the block cache's memory bound (default 64 MiB, or `CONTEXTSHIFT_BLOCK_CACHE_BYTES`
    at start; recent requests' text, held for the next turn, take up to a quarter more),
    dropping what it holds; 0 turns it off."""
    if capacity_bytes < 0:
        raise InvalidOptions([("capacity_bytes", f"must be >= 0, got {capacity_bytes}")])
    engine.configure_block_cache(capacity_bytes)
