"""A thread's CPU time and how often it blocked, read from its `/proc/<pid>/task/<tid>` entry
(Linux): the benchmarks that say which thread a call costs read them before and after a run."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(task: Path) -> float:
    """The user + system CPU seconds the thread at `task` has used."""
    fields = (task / "stat").read_text().rpartition(")")[2].split()  # after the name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def blocks(task: Path) -> int:
    """How many times the thread at `task` has blocked (voluntary context switches: a wait for the
    GIL, a lock, the network)."""
    return int((task / "status").read_text().split("\nvoluntary_ctxt_switches:")[1].split()[0])
