"""The benchmark's plots (PNG, matplotlib): latency against conversation size for every contender,
and every profile's counting throughput."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

CONTENDERS = {
    "library_s": "contextshift, dicts (heuristic)",
    "library_json_s": "contextshift, JSON bytes (heuristic)",
    "cached_s": "contextshift, dicts (o200k_base, cached counts)",
    "cached_json_s": "contextshift, JSON bytes (o200k_base, cached counts)",
    "reference_s": "pure-Python reference",
    "trim_messages_s": "LangChain trim_messages (same rule, counted per call)",
    "trim_lookup_s": "LangChain trim_messages (o200k_base counts looked up)",
}


def write(shift_rows: list[dict[str, Any]], profile_rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    latency = folder / "shift_latency.png"
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label in CONTENDERS.items():
        points = [(r["blocks"], r[key] * 1e3) for r in shift_rows if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="blocks in the conversation", ylabel="ms per shift (median)")
    ax.set_title("Shift latency against conversation size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(latency, dpi=110)
    plt.close(fig)

    throughput = folder / "profile_throughput.png"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [r["profile"] for r in profile_rows]
    x = range(len(names))
    width = 0.4
    ax.bar(
        [i - width / 2 for i in x],
        [r["single_thread_mb_per_s"] for r in profile_rows],
        width,
        label="one thread",
    )
    ax.bar([i + width / 2 for i in x], [r["batch_mb_per_s"] for r in profile_rows], width, label="batch")
    ax.set_xticks(list(x), names, rotation=20)
    ax.set(yscale="log", ylabel="MB/s of text (count cache bypassed)")
    ax.set_title("Counting throughput per profile")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(throughput, dpi=110)
    plt.close(fig)
    return [latency, throughput]
