"""Counting throughput, side by side in one run (part of `make benchmark`; also
`python benchmarks/counting.py [--quick]`).

Same corpus for every counter: tests/data/tokenizer_corpus.json plus generated prose, code and
CJK. Single text on one thread (contextshift counts one text on the calling thread), and a batch
of 10k short messages (each library's batch call, on all cores). contextshift's count cache is
off for the throughput rows, so they measure counting, not remembering; it is on for the recount
row. Prints a table and the issue's targets, writes benchmarks/results/counting.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import sysconfig
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bpe_openai  # type: ignore[import-untyped]
import splintr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import contextshift  # noqa: E402
from contextshift import profiles  # noqa: E402
from tests.test_profiles_exact import QWEN_JSON, hf_tokenizer, openai_encoding  # noqa: E402


def corpus_text(target_bytes: int) -> str:
    """The test corpus, then Python standard library sources (code and English docstrings, on
    every machine), until `target_bytes`: distinct text, so no cache sees a repeat it would not
    see in real input."""
    cases = json.loads((ROOT / "tests/data/tokenizer_corpus.json").read_text("utf-8"))["cases"]
    parts = [c["text"] for c in cases]
    size = sum(len(p.encode()) for p in parts)
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if size >= target_bytes:
            break
        text = path.read_text("utf-8", errors="replace")
        parts.append(text)
        size += len(text.encode())
    return "\n".join(parts)


def messages(n: int, mean_bytes: int = 400) -> list[str]:
    """`n` distinct chat-sized slices of the corpus (prose, code, CJK, emoji), 0.5x-1.5x `mean_bytes`."""
    text = corpus_text(n * mean_bytes * 2)
    out, start = [], 0
    for i in range(n):
        length = mean_bytes // 2 + (i * 7919) % mean_bytes
        out.append(f"[{i}] {text[start : start + length]}")
        start += length
    return out


def best_seconds(fn: Callable[[], Any], repeat: int, *, cold: bool = True) -> float:
    """Best of `repeat` runs; with `cold`, every tokenizer memo is emptied first (contextshift's
    and splintr-rs's pre-token caches), so no run reuses work from the one before."""
    times = []
    for _ in range(repeat):
        if cold:
            reset_memos()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


_SPLINTR: list[Any] = []  # splintr-rs tokenizers in use, for reset_memos


def reset_memos() -> None:
    profiles.clear_cache()
    for tokenizer in _SPLINTR:
        tokenizer.clear_cache()


# The reference each profile must equal; a contender that differs is timed and flagged.
REFERENCES = {"o200k_base": "tiktoken", "qwen": "hf tokenizers"}


def contenders() -> dict[str, dict[str, Callable[[str], int]]]:
    """profile -> contender name -> single-text counter."""
    o200k = openai_encoding("o200k_base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        bpe = bpe_openai.get_encoding("o200k_base")
    sp_o200k = splintr.Tokenizer.from_pretrained("o200k_base")
    sp_qwen = splintr.Tokenizer.from_pretrained("qwen3")
    _SPLINTR.extend([sp_o200k, sp_qwen])
    hf_qwen = hf_tokenizer(QWEN_JSON, keep_added=False)
    return {
        "o200k_base": {
            "contextshift": lambda t: contextshift.count_tokens([t], "o200k_base")[0],
            "tiktoken": lambda t: len(o200k.encode_ordinary(t)),
            "bpe-openai": lambda t: len(bpe.encode_ordinary(t)),
            "splintr-rs": lambda t: len(sp_o200k.encode_ordinary(t)),
        },
        "qwen": {
            "contextshift": lambda t: contextshift.count_tokens([t], "qwen")[0],
            "hf tokenizers": lambda t: len(hf_qwen.encode(t, add_special_tokens=False).ids),
            "splintr-rs": lambda t: len(sp_qwen.encode_ordinary(t)),
        },
    }


def batch_contenders() -> dict[str, Callable[[list[str]], int]]:
    o200k = openai_encoding("o200k_base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        bpe = bpe_openai.get_encoding("o200k_base")
    sp = splintr.Tokenizer.from_pretrained("o200k_base")
    _SPLINTR.append(sp)
    return {
        "contextshift": lambda ts: sum(contextshift.count_tokens(ts, "o200k_base")),
        "tiktoken": lambda ts: sum(map(len, o200k.encode_ordinary_batch(ts))),
        "bpe-openai": lambda ts: sum(map(len, bpe.encode_ordinary_batch(ts))),
        # splintr-rs has no ordinary batch call: its batch matches special-token spellings.
        "splintr-rs": lambda ts: sum(map(len, sp.encode_batch(ts))),
    }


def run(quick: bool) -> dict[str, Any]:
    repeat = 2 if quick else 7
    # bpe-openai refuses texts of a million characters or 200,000 tokens.
    text = corpus_text(200_000 if quick else 700_000)
    size = len(text.encode())
    batch = messages(10_000)
    batch_bytes = sum(len(t.encode()) for t in batch)
    rows: list[dict[str, Any]] = []
    before = profiles.cache_stats().capacity_bytes
    profiles.configure_cache(0)
    try:
        for profile, counters in contenders().items():
            counts = {name: fn(text) for name, fn in counters.items()}
            reference = REFERENCES[profile]
            assert counts["contextshift"] == counts[reference], f"{profile}: {counts}"
            for name, fn in counters.items():
                seconds = best_seconds(functools.partial(fn, text), repeat)
                row = {"case": f"single text, {profile}", "counter": name, "mb_s": size / seconds / 1e6}
                if counts[name] != counts[reference]:
                    row["note"] = f"counts {counts[name]}, {reference} {counts[reference]}"
                rows.append(row)
        batch_counters = batch_contenders()
        sums = {name: fn(batch) for name, fn in batch_counters.items()}
        assert sums["contextshift"] == sums["tiktoken"], sums
        for name, batch_fn in batch_counters.items():
            seconds = best_seconds(functools.partial(batch_fn, batch), repeat)
            row = {"case": "10k messages, o200k_base", "counter": name, "mb_s": batch_bytes / seconds / 1e6}
            if sums[name] != sums["tiktoken"]:
                row["note"] = f"counts {sums[name]}, tiktoken {sums['tiktoken']}"
            rows.append(row)
        big = corpus_text(20_000_000 if quick else 200_000_000)
        seconds = best_seconds(functools.partial(contextshift.count_tokens, [big], "heuristic"), repeat)
        rows.append(
            {
                "case": "single text, heuristic",
                "counter": "contextshift",
                "mb_s": len(big.encode()) / seconds / 1e6,
            }
        )
        growth = worst_case_growth(repeat)
    finally:
        profiles.configure_cache(before)
    recount = cached_recount(repeat)
    return {"rows": rows, "growth": growth, "recount": recount}


def worst_case_growth(repeat: int) -> list[dict[str, Any]]:
    """Seconds to count n bytes of one repeated character: linear time doubles with n."""
    out = []
    for char in ("a", "日"):
        for n in (250_000, 500_000, 1_000_000, 2_000_000):
            text = char * (n // len(char.encode()))
            seconds = best_seconds(functools.partial(contextshift.count_tokens, [text], "o200k_base"), repeat)
            out.append({"char": char, "bytes": n, "seconds": seconds})
    return out


def cached_recount(repeat: int) -> dict[str, float]:
    """A 1k-message chat counted cold, then recounted with every message cached (what a chat that
    resends its history costs)."""
    history = [{"role": "user" if i % 2 else "assistant", "content": m} for i, m in enumerate(messages(1000))]

    count = functools.partial(contextshift.count_tokens, history, "o200k_base")
    cold_s = best_seconds(count, repeat)
    warm_s = best_seconds(count, repeat * 3, cold=False)
    stats = profiles.cache_stats()
    return {"cold_s": cold_s, "warm_s": warm_s, "speedup": cold_s / warm_s, "hit_ratio": stats.hit_ratio}


def report(result: dict[str, Any]) -> list[str]:
    rows = result["rows"]
    print(f"{'case':<28} {'counter':<14} {'MB/s':>9}")
    for r in rows:
        note = f"  (inexact: {r['note']})" if "note" in r else ""
        print(f"{r['case']:<28} {r['counter']:<14} {r['mb_s']:9.1f}{note}")
    rate = {(r["case"], r["counter"]): r["mb_s"] for r in rows}
    findings = []
    single = "single text, o200k_base"
    ours = rate[(single, "contextshift")]
    vs_tiktoken = ours / rate[(single, "tiktoken")]
    fastest_name, fastest = max(
        ((c, v) for (case, c), v in rate.items() if case == single and c != "contextshift"),
        key=lambda x: x[1],
    )
    findings.append(
        f"o200k single text vs tiktoken: {vs_tiktoken:.2f}x (target >= 2.5x): {'PASS' if vs_tiktoken >= 2.5 else 'FAIL'}"
    )
    vs_fastest = ours / fastest
    findings.append(
        f"o200k single text vs fastest contender ({fastest_name}): {vs_fastest:.2f}x (target >= 1x): {'PASS' if vs_fastest >= 1 else 'FAIL'}"
    )
    batch = "10k messages, o200k_base"
    for other in ("tiktoken", "splintr-rs", "bpe-openai"):
        findings.append(
            f"10k messages vs {other}: {rate[(batch, 'contextshift')] / rate[(batch, other)]:.2f}x"
        )
    qwen = "single text, qwen"
    findings.append(
        f"qwen single text vs hf tokenizers: {rate[(qwen, 'contextshift')] / rate[(qwen, 'hf tokenizers')]:.2f}x"
    )
    heuristic = rate[("single text, heuristic", "contextshift")] / 1000
    findings.append(
        f"heuristic: {heuristic:.2f} GB/s (target >= 1 GB/s): {'PASS' if heuristic >= 1 else 'FAIL'}"
    )
    recount = result["recount"]
    findings.append(
        f"cached recount of a 1k-message history: {recount['speedup']:.1f}x faster than cold "
        f"(target >= 10x): {'PASS' if recount['speedup'] >= 10 else 'FAIL'}"
    )
    for char in ("a", "日"):
        points = [g for g in result["growth"] if g["char"] == char]
        ratio = points[-1]["seconds"] / points[0]["seconds"]
        size_ratio = points[-1]["bytes"] / points[0]["bytes"]
        findings.append(
            f"worst case {char!r}*n, {points[0]['bytes'] // 1000} KB -> {points[-1]['bytes'] // 1000} KB: "
            f"time x{ratio:.1f} for size x{size_ratio:.0f} (quadratic would be x{size_ratio**2:.0f})"
        )
    for line in findings:
        print(line)
    return findings


def main(quick: bool) -> list[str]:
    result = run(quick)
    findings = report(result)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "counting.json").write_text(json.dumps({**result, "findings": findings}, indent=2))
    return findings


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: smaller inputs, fewer repeats")
    main(parser.parse_args().quick)
