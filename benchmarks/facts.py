"""Facts benchmark: how many stated facts a `summarize` shift keeps, over a shipped corpus of long
chats with their fact lists (benchmarks/data/fact_chats.json: file paths, URLs, dates, amounts,
identifiers, numbers, code spans).

Each chat is shifted with `summarize` at the default summary size (512 tokens, o200k_base) and a
budget of a fifth of its tokens, so most of the history is left out. Retention is the share of
the facts stated in the left-out blocks that the summary carries verbatim. Beside it, in the same
run, the baseline a plain cut gives at the same size: the most recent left-out text that fits in
the summary's tokens. Target: retention >= 90%; the exit status is 1 when it is missed
(benchmarks/run.py passes that on).

    python benchmarks/facts.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import contextshift  # noqa: E402

CORPUS = ROOT / "benchmarks" / "data" / "fact_chats.json"
PROFILE = "o200k_base"
TARGET = 0.90
SUMMARY_TOKENS = 512


def recent_text_that_fits(texts: list[str], tokens: int) -> str:
    """The baseline: the most recent left-out text within `tokens` (a plain cut, no selection)."""
    joined = "\n".join(texts)
    low, high = 0, len(joined)
    while low < high:  # the longest suffix that fits
        middle = (low + high) // 2
        if contextshift.count_tokens([joined[middle:]], PROFILE)[0] <= tokens:
            high = middle
        else:
            low = middle + 1
    return joined[low:]


def measure(chat: dict[str, Any]) -> dict[str, Any]:
    blocks = chat["blocks"]
    budget = sum(contextshift.count_tokens(blocks, PROFILE)) // 5
    options = {"summary_max_tokens": SUMMARY_TOKENS}
    result = contextshift.shift_context(
        blocks, budget=budget, profile=PROFILE, strategy="summarize", options=options
    )
    assert result.summary is not None, f"{chat['name']}: no summary"
    left_out = {d.id for d in result.excluded}
    texts = [b["content"] for b in blocks if b["id"] in left_out]
    stated = [f for f in chat["facts"] if any(f in t for t in texts)]
    summary = result.summary.text
    baseline = recent_text_that_fits(texts, result.summary.tokens)
    return {
        "chat": chat["name"],
        "left_out": len(left_out),
        "facts": len(stated),
        "kept": sum(f in summary for f in stated),
        "baseline_kept": sum(f in baseline for f in stated),
        "summary_tokens": result.summary.tokens,
        "extracted": [result.summary.facts_kept, result.summary.facts_total],
    }


def verdict(rows: list[dict[str, Any]], target: float = TARGET) -> tuple[str, int]:
    """The finding line over `rows` and the exit status: 0 when retention meets `target`, 1 when
    it misses (a benchmark that cannot fail checks nothing)."""
    facts = sum(r["facts"] for r in rows)
    retention = sum(r["kept"] for r in rows) / facts if facts else 0.0
    baseline = sum(r["baseline_kept"] for r in rows) / facts if facts else 0.0
    kept, total = (sum(r["extracted"][k] for r in rows) for k in (0, 1))
    extracted = kept / total if total else 0.0
    met = facts > 0 and retention >= target
    finding = (
        f"fact retention {retention:.1%} of {facts} facts (plain cut at the same size: {baseline:.1%}; "
        f"the plans' own facts_kept/facts_total: {kept}/{total} = {extracted:.1%}; "
        f"target >= {target:.0%}): {'PASS' if met else 'FAIL'}"
    )
    return finding, 0 if met else 1


def main(quick: bool = False) -> int:
    """Runs the benchmark; the exit status is nonzero when the retention target is missed."""
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    rows = [measure(chat) for chat in (corpus[:2] if quick else corpus)]
    print(f"{'chat':<8} {'left out':>8} {'facts':>6} {'summary':>8} {'plain cut':>10} {'tokens':>7}")
    for r in rows:
        print(
            f"{r['chat']:<8} {r['left_out']:>8} {r['facts']:>6} {r['kept'] / r['facts']:>8.0%} "
            f"{r['baseline_kept'] / r['facts']:>10.0%} {r['summary_tokens']:>7}"
        )
    finding, status = verdict(rows)
    print(finding)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "facts.json").write_text(json.dumps({"rows": rows, "findings": [finding]}, indent=2))
    return status


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: two chats")
    raise SystemExit(main(parser.parse_args().quick))
