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

With `--baseline REV`, `summarize` as it was at git revision REV (its strategy, summarizer and
fact modules, loaded from git) runs beside today's on the same conversations, in the same run,
both with summary_max_tokens 512: the ratio is what a change to the summarizer cost.

    python benchmarks/strategies.py [--quick] [--baseline REV]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
import types
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


def seconds(
    blocks: list[dict[str, Any]],
    budget: int,
    strategy: str,
    repeat: int,
    options: dict[str, Any] | None = None,
) -> float:
    contextshift.shift_context(blocks, budget=budget, strategy=strategy, options=options)  # warm: first loads
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = contextshift.shift_context(blocks, budget=budget, strategy=strategy, options=options)
        _ = result.kept, result.excluded, result.messages
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# The modules `summarize` is made of, and the import of each that the next one has.
_SUMMARIZE_MODULES = (
    ("service/contextshift/summarizer/facts.py", ""),
    (
        "service/contextshift/summarizer/extractive.py",
        "from contextshift.summarizer import facts as fact_spans",
    ),
    ("service/contextshift/strategies/summarize.py", "from contextshift.summarizer import extractive"),
)


def baseline_summarize(revision: str) -> str:
    """Registers `summarize` as it was at git `revision` as the strategy `summarize@<revision>`;
    returns its name. Each module is loaded from git with its import of the one before pointed at
    that one's old version (the import must be there as written: else this fails loudly)."""
    loaded: list[types.ModuleType] = []
    for path, old_import in _SUMMARIZE_MODULES:
        source = subprocess.run(
            ["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        if old_import:
            if old_import not in source:
                raise SystemExit(f"{path} at {revision} has no line {old_import!r}: cannot load it as before")
            alias = old_import.rsplit(" ", 1)[-1]
            source = source.replace(old_import, f"import {loaded[-1].__name__} as {alias}")
        module = types.ModuleType(f"baseline_{Path(path).stem}")
        sys.modules[module.__name__] = module
        exec(compile(source, f"{revision}:{path}", "exec"), module.__dict__)  # this repository's own code
        loaded.append(module)
    name = f"summarize@{revision}"
    contextshift.strategies.registry.add(dataclasses.replace(loaded[-1].INFO, name=name))
    return name


def compare_baseline(revision: str, sizes: tuple[int, int], repeat: int) -> list[str]:
    """Today's `summarize` beside `summarize@<revision>`, both at summary_max_tokens 512."""
    old = baseline_summarize(revision)
    options = {"summary_max_tokens": 512}
    print(f"{'blocks':>8} {'summarize ms':>13} {old + ' ms':>24} {'ratio':>7}")
    findings = []
    for n in sizes:
        blocks = generate(n)
        budget = sum(contextshift.count_tokens(blocks)) // 2
        now = seconds(blocks, budget, "summarize", repeat, options)
        before = seconds(blocks, budget, old, repeat, options)
        print(f"{n:>8} {now * 1e3:>13.1f} {before * 1e3:>24.1f} {now / before:>6.2f}x")
        verdict = "PASS" if now <= 2 * before else "FAIL"
        findings.append(f"summarize at {n} blocks: {now / before:.2f}x {old} (target <= 2x): {verdict}")
    for line in findings:
        print(line)
    return findings


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


def main(quick: bool = False, baseline: str | None = None) -> int:
    sizes = (1_000, 10_000) if quick else (10_000, 100_000)
    print(f"Strategies: {sizes[0]} and {sizes[1]} blocks, heuristic profile, budget half the total")
    repeat = 1 if quick else 3
    findings = report(measure(sizes, repeat), sizes)
    if baseline:
        findings += compare_baseline(baseline, sizes, repeat)
    return int(any(line.endswith("FAIL") for line in findings))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: smaller sizes, one repeat")
    parser.add_argument("--baseline", help="a git revision whose summarize runs beside today's")
    args = parser.parse_args()
    raise SystemExit(main(args.quick, args.baseline))
