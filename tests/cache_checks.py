"""What the tests of the caches that take what an earlier request read share (the block cache
from JSON, requests from dicts sent again): a fresh cache for each test, a shift with nothing kept,
and a bad block after a history taken from the cache refused as without it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

import contextshift
from contextshift import profiles

Block = dict[str, Any]
R = TypeVar("R")


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    bound = profiles.block_cache_stats().capacity_bytes
    profiles.configure_block_cache(bound)  # empty, counters kept
    yield
    profiles.configure_block_cache(bound)


def uncached(shift: Callable[[list[Block], int], R]) -> Callable[[list[Block], int], R]:
    """`shift` with the cache off, which empties it: nothing taken, nothing kept."""

    def run(blocks: list[Block], budget: int) -> R:
        bound = profiles.block_cache_stats().capacity_bytes
        profiles.configure_block_cache(0)
        try:
            return shift(blocks, budget)
        finally:
            profiles.configure_block_cache(bound)

    return run


def refused_alike(
    shift: Callable[[list[Block], int], object], history: list[Block], bad: list[Block], sends: int = 1
) -> None:
    """Each of `bad` after `history` is refused with the violations it gets with the cache off,
    when `history` is taken from the cache: sent `sends` times without its last block (so it is
    kept), then whole (so the request it extends is kept with its ids' hashes), each time."""
    for block in bad:
        for _ in range(sends):
            shift(history[:-1], 1000)
        shift(history, 1000)
        errors = []
        for run in (shift, uncached(shift)):
            with pytest.raises(contextshift.InvalidBlocks) as err:
                run([*history, block], 1000)
            errors.append([(v.field, v.description) for v in err.value.violations])
        assert errors[0] == errors[1] and errors[0]
