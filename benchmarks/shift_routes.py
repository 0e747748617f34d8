"""The library's shift as the benchmarks time it (benchmarks/run.py on generated conversations,
benchmarks/real_chat.py on real text): from dicts, from JSON bytes reading every decision, and from
JSON bytes as the service sends its reply; and the median time of a call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import contextshift
from contextshift import engine

# The exact profile whose counts the "cached" routes find in the count cache (a resent history).
CACHED_PROFILE = "o200k_base"


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def shift_dicts(blocks: list[dict[str, Any]], budget: int, profile: str = "heuristic") -> object:
    result = contextshift.shift_context(blocks, budget=budget, profile=profile)
    # Read what the reference builds: decisions and messages are built on first use.
    return result.kept, result.excluded, result.messages


def shift_json(text: bytes, budget: int, profile: str = "heuristic") -> object:
    result = contextshift.shift_context(text, budget=budget, profile=profile)
    # A library caller reading every decision, and the kept blocks' own text.
    return result.kept, result.excluded, result.messages_json_bytes()


def shift_json_sent(text: bytes, budget: int, profile: str) -> object:
    result = contextshift.shift_context(text, budget=budget, profile=profile)
    # What the gRPC service sends on: the decisions encoded by the core (no Python object per
    # block, api/service/plans.py) and the kept blocks' own text.
    assert isinstance(result.decisions, engine.Plan)
    return result.decisions.encode_decisions(1, 2), result.messages_json_bytes()
