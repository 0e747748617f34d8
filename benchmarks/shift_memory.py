"""Peak memory of one shift: `python -m benchmarks.shift_memory [BLOCKS]` (part of `make benchmark`).

Each measurement runs in a fresh process: it builds the conversation (dicts, and the same as JSON
bytes), fills the count cache for `o200k_base` (the benchmark's cached-count shifts), then resets
the kernel's peak-RSS mark (`/proc/self/clear_refs`) and runs one shift, reading what the timed
shift reads. The peak is VmHWM after the shift minus VmRSS before it: the memory the shift itself
took at its highest, the input and the caches not counted. mimalloc is told to return freed pages
at once (`MIMALLOC_PURGE_DELAY=0`), so memory an earlier call freed is not reused unseen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "o200k_base"
ROUTES = ("json", "dicts")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure_here(blocks: int, route: str) -> float:
    """In this process: the peak MiB one shift of `blocks` blocks takes (see the module's doc)."""
    sys.path.insert(0, str(ROOT))
    import contextshift
    from benchmarks.conversation import generate

    conversation = generate(blocks)
    text = json.dumps(conversation, ensure_ascii=False).encode()
    budget = sum(contextshift.count_tokens(conversation, PROFILE)) // 2
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _status_kib("VmRSS")
    if route == "json":
        result = contextshift.shift_context(text, budget=budget, profile=PROFILE)
        _ = result.kept, result.excluded, result.messages_json_bytes()
    else:
        result = contextshift.shift_context(conversation, budget=budget, profile=PROFILE)
        _ = result.kept, result.excluded, result.messages
    return (_status_kib("VmHWM") - before) / 1024


def measure(blocks: int) -> dict[str, float]:
    """Each route's peak MiB, each in a fresh process."""
    env = {**os.environ, "MIMALLOC_PURGE_DELAY": "0"}
    peaks = {}
    for route in ROUTES:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.shift_memory", "--one", str(blocks), route],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[route] = float(out.stdout.strip())
    return peaks


def main(quick: bool) -> dict[str, float]:
    blocks = 10_000 if quick else 100_000
    peaks = measure(blocks)
    for route, mib in peaks.items():
        print(f"peak memory of a {blocks}-block shift from {route}, counts cached: {mib:.1f} MiB")
    return peaks


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(f"{_measure_here(int(sys.argv[2]), sys.argv[3]):.2f}")
    else:
        main(quick=len(sys.argv) > 1 and sys.argv[1] == "--quick")
