"""Strategies benchmark: every local built-in strategy on the shift benchmark's conversations, so
a strategy whose cost grows faster than the engine's shows up (one read a per-block list that
was rebuilt on every read: a 100k-block `summarize` took minutes, truncate a fraction of a
second).

Each strategy shifts the same generated conversation (benchmarks/conversation.py, heuristic
profile, budget half the total; for `manual`, every 50th user turn flagged) at two sizes, median
of repeated runs, beside `truncate` in the same run. Target: from the smaller size to the larger
(ten times as many blocks) each strategy's time grows at most 25x, twice n log n: linear work
grows about 10x, quadratic work 100x. Run alone, the exit status is 1 when a strategy misses it;
benchmarks/run.py reports it as its other timings. `llm-compact` needs an endpoint and is left
out.

    python benchmarks/strategies.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import contextshift  # noqa: E402
from benchmarks.conversation import generate  # noqa: E402

STRATEGIES = ["truncate", "summarize", "vector-recall", "manual", "clear-tool-results"]
MAX_GROWTH = 25.0


def flagged(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`blocks` with every 50th user turn (not the last) flagged for `manual`."""
    users = [i for i, b in enumerate(blocks[:-1]) if b["role"] == "user"]
    marked = set(users[::50])
    return [{**b, "meta": {"manualExcluded": True}} if i in marked else b for i, b in enumerate(blocks)]


def seconds(blocks: list[dict[str, Any]], budget: int, strategy: str, repeat: int) -> float:
    contextshift.shift_context(blocks, budget=budget, strategy=strategy)  # warm: imports, first loads
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = contextshift.shift_context(blocks, budget=budget, strategy=strategy)
        _ = result.kept, result.excluded, result.messages
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(sizes: tuple[int, int], repeat: int) -> list[dict[str, Any]]:
    rows = []
    conversations = {n: generate(n) for n in sizes}
    for strategy in STRATEGIES:
        row: dict[str, Any] = {"strategy": strategy}
        for n, blocks in conversations.items():
            budget = sum(contextshift.count_tokens(blocks)) // 2
            shifted = flagged(blocks) if strategy == "manual" else blocks
            row[f"{n}_s"] = seconds(shifted, budget, strategy, repeat)
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]], sizes: tuple[int, int]) -> list[str]:
    small, large = sizes
    truncate = rows[0]
    print(f"{'strategy':<20} {f'{small} ms':>10} {f'{large} ms':>10} {'x truncate':>11} {'growth':>8}")
    findings = []
    for row in rows:
        growth = row[f"{large}_s"] / row[f"{small}_s"]
        versus = row[f"{large}_s"] / truncate[f"{large}_s"]
        print(
            f"{row['strategy']:<20} {row[f'{small}_s'] * 1e3:>10.1f} {row[f'{large}_s'] * 1e3:>10.1f}"
            f" {versus:>10.1f}x {growth:>7.1f}x"
        )
        verdict = "PASS" if growth <= MAX_GROWTH else "FAIL"
        findings.append(
            f"{row['strategy']}: {small} -> {large} blocks grows {growth:.1f}x (target <= {MAX_GROWTH:.0f}x): {verdict}"
        )
    for line in findings:
        print(line)
    return findings


def main(quick: bool = False) -> int:
    sizes = (1_000, 10_000) if quick else (10_000, 100_000)
    print(f"Strategies: {sizes[0]} and {sizes[1]} blocks, heuristic profile, budget half the total")
    findings = report(measure(sizes, repeat=1 if quick else 3), sizes)
    return int(any(line.endswith("FAIL") for line in findings))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: smaller sizes, one repeat")
    raise SystemExit(main(parser.parse_args().quick))
