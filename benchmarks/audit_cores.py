"""The audited path with the server on one core against both: `python benchmarks/audit_cores.py [--quick]`.

A diagnosis for issue 36 (the audited call's share of the unaudited calls/s): audit_path's serving
run over SQLite (the real server, one worker, ghz at concurrency 8, 48 KiB of ShareGPT text as
`shift`, `warm` and `cold`), with every thread of the server's processes moved between slices
(`os.sched_setaffinity` on each of them) onto one core or back onto both, the order turning each round, so the two meet
the same machine. ghz runs wherever the kernel puts it. Beside each slice's calls/s and p50: the CPU
the server's threads used per call, and how often per call they blocked (voluntary context
switches: a wait for the GIL, a lock, the network), from `/proc/<pid>/task/*`.

On one core the unaudited call loses the second core its gRPC threads used. An audited call has
two Python threads to run, the event loop and the group writer, which take the GIL from each other
at every statement the writer runs (sqlite3 lets it go around each one); on two cores each taking
is a wait and a wake-up across cores. Where the audited calls/s rise on one core, with less CPU and
fewer blocks per call, those hand-offs cost more than the second core gives.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.audit_path import RPCS, serving_data, serving_worker, slices  # noqa: E402
from benchmarks.output import Column, command, print_table, run_and_publish  # noqa: E402
from benchmarks.proc_threads import blocks, cpu_seconds  # noqa: E402

ONE, BOTH = {0}, {0, 1}
MEDIANS = ("calls_per_s", "p50_ms", "cpu_ms", "blocks")


def _threads(pid: int) -> list[Path]:
    """The /proc entries of every thread of the server's process `pid` and of its children (its
    workers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [task for process in [str(pid), *children] for task in Path(f"/proc/{process}/task").iterdir()]


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of the server `pid` onto `cpus`."""
    for task in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def _used(pid: int) -> tuple[float, int]:
    """The CPU seconds the server's threads have used, and how many times they blocked."""
    seconds, blocked = 0.0, 0
    for task in _threads(pid):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            seconds, blocked = seconds + cpu_seconds(task), blocked + blocks(task)
    return seconds, blocked


def run(quick: bool) -> list[dict[str, Any]]:
    rounds, seconds = (1, 1.0) if quick else (6, 3.0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = serving_data(tmp)
        with serving_worker(tmp, f"sqlite:///{tmp}/audit.db", data) as server:
            for r in range(rounds):
                for cpus in (BOTH, ONE) if r % 2 == 0 else (ONE, BOTH):
                    _pin(server.proc.pid, cpus)
                    for rpc in RPCS:
                        cpu, blocked = _used(server.proc.pid)
                        (row,) = slices(server, data, seconds, (rpc,))
                        cpu_after, blocked_after = _used(server.proc.pid)
                        rows.append(
                            {"cores": len(cpus), "round": r}
                            | row
                            | {
                                "cpu_ms": 1e3 * (cpu_after - cpu) / row["calls"],
                                "blocks": (blocked_after - blocked) / row["calls"],
                            }
                        )
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    medians = []
    for cores in (2, 1):
        for rpc in RPCS:
            mine = [r for r in rows if r["cores"] == cores and r["rpc"] == rpc]
            medians.append(
                {"cores": cores, "rpc": rpc} | {k: statistics.median(r[k] for r in mine) for k in MEDIANS}
            )
    by = {(m["cores"], m["rpc"]): m for m in medians}
    for m in medians:
        m["share"] = m["calls_per_s"] / by[(m["cores"], "shift")]["calls_per_s"]
    print_table(
        (
            Column("server's cores", "cores", 14),
            Column("rpc", "rpc", 5),
            Column("calls/s", "calls_per_s", 8, ".0f"),
            Column("p50 ms", "p50_ms", 7, ".2f"),
            Column("of shift's calls/s", "share", 18, ".0%"),
            Column("server CPU ms/call", "cpu_ms", 18, ".3f"),
            Column("blocks/call", "blocks", 11, ".1f"),
        ),
        medians,
    )
    return [
        f"{rpc} on one core: {by[(1, rpc)]['calls_per_s'] / by[(2, rpc)]['calls_per_s']:.2f}x the calls/s, "
        f"{by[(1, rpc)]['cpu_ms'] / by[(2, rpc)]['cpu_ms']:.2f}x the server's CPU per call, "
        f"{by[(1, rpc)]['blocks']:.1f} blocks per call against {by[(2, rpc)]['blocks']:.1f} on two "
        "(medians of the rounds)"
        for rpc in RPCS
    ]


def main(quick: bool = False) -> int:
    return run_and_publish("audit_cores", run, report, quick)


if __name__ == "__main__":
    command(main, __doc__, "one round of 1 s slices")
