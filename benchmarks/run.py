"""Benchmark suite: `make benchmark` (or `python benchmarks/run.py [--quick]`).

Also runs the token counting benchmark (benchmarks/counting.py: contextshift vs tiktoken, HF tokenizers,
bpe-openai, splintr-rs), the blocks_json readers (benchmarks/rust, json-readers: contextshift's reader vs
serde_json, sonic-rs, simd-json) and the end-to-end gRPC benchmark (benchmarks/grpc_bench.py: ShiftContext
vs echo).

Shift of generated conversations of 1k, 10k and 100k blocks through the library (Rust core) and
through the pure-Python reference in tests/reference, side by side in one run. Prints a table with
the ratio, checks the targets of the engine issue (>= 20x at 10k; growth from 10k to 100k no worse
than n log n) and writes benchmarks/results/shift.json. Timings are medians of repeated runs;
ratios, not absolute times, are what to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.reference and benchmarks.conversation

import contextshift  # noqa: E402
from benchmarks import counting, grpc_bench  # noqa: E402
from benchmarks.conversation import generate  # noqa: E402
from tests.reference import reference_shift  # noqa: E402


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(sizes: list[int], repeat: int, reference_max: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        blocks = generate(n)
        total = sum(contextshift.count_tokens(blocks))
        budget = total // 2  # force real removal work
        rust_result = contextshift.shift_context(blocks, budget=budget)

        def shift(blocks: list[dict[str, Any]] = blocks, budget: int = budget) -> object:
            result = contextshift.shift_context(blocks, budget=budget)
            # Read what the reference builds: decisions and messages are built on first use.
            return result.kept, result.excluded, result.messages

        def reference(blocks: list[dict[str, Any]] = blocks, budget: int = budget) -> object:
            return reference_shift(blocks, budget=budget)

        row: dict[str, Any] = {
            "blocks": len(blocks),
            "budget": budget,
            "excluded": len(rust_result.excluded),
            "rust_s": median_seconds(shift, repeat),
            "reference_s": None,
        }
        if n <= reference_max:
            ref = reference_shift(blocks, budget=budget)
            assert [k[0] for k in ref.kept] == [d.id for d in rust_result.kept], "reference disagrees"
            row["reference_s"] = median_seconds(reference, max(1, repeat // 3))
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    print(f"{'blocks':>8} {'excluded':>9} {'rust ms':>10} {'reference ms':>13} {'speed-up':>9}")
    for r in rows:
        ref = r["reference_s"]
        ref_ms = f"{ref * 1e3:13.1f}" if ref else f"{'-':>13}"
        ratio = f"{ref / r['rust_s']:8.1f}x" if ref else f"{'-':>9}"
        print(f"{r['blocks']:>8} {r['excluded']:>9} {r['rust_s'] * 1e3:10.2f} {ref_ms} {ratio}")
    findings = []
    by_size = {r["blocks"] // 1000 * 1000: r for r in rows}
    ten_k = by_size.get(10_000)
    if ten_k and ten_k["reference_s"]:
        ratio = ten_k["reference_s"] / ten_k["rust_s"]
        findings.append(f"speed-up at 10k: {ratio:.1f}x (target >= 20x): {'PASS' if ratio >= 20 else 'FAIL'}")
    hundred_k = by_size.get(100_000)
    if ten_k and hundred_k:
        growth = hundred_k["rust_s"] / ten_k["rust_s"]
        big, small = hundred_k["blocks"], ten_k["blocks"]
        bound = (big * math.log(big)) / (small * math.log(small))
        verdict = "PASS" if growth <= bound else "FAIL"
        findings.append(f"growth 10k -> 100k: {growth:.1f}x (n log n bound {bound:.1f}x): {verdict}")
    for line in findings:
        print(line)
    return findings


def json_readers(quick: bool, out: Path) -> None:
    """The Rust-side benchmark of blocks_json readers (benchmarks/rust/src/json_readers.rs)."""
    command = ["cargo", "run", "--release", "--quiet", "-p", "contextshift-benches", "--bin", "json-readers"]
    subprocess.run(
        [*command, "--", "--json", str(out), *(["--quick"] if quick else [])], cwd=ROOT, check=True
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, one repeat")
    args = parser.parse_args()
    if args.quick:
        rows = run([1_000, 10_000], repeat=1, reference_max=1_000)
    else:
        rows = run([1_000, 10_000, 100_000], repeat=9, reference_max=100_000)
    findings = report(rows)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "shift.json").write_text(json.dumps({"rows": rows, "findings": findings}, indent=2))
    print()
    counting.main(args.quick)  # token counting throughput (benchmarks/counting.py)
    print()
    json_readers(args.quick, out / "json_readers.json")
    print()
    return grpc_bench.main(args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
