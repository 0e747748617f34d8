"""Where an audited ShiftContext's CPU goes: `python benchmarks/audit_cost.py [--quick]`.

The server's ContextShiftService driven in this process (no gRPC, no client on the same cores), so
the CPU one call costs (user + system time of the whole process, every thread, over the calls) is
read without the load tool's share. Same 48 KiB of real text as the serving benchmark
(benchmarks/ghz_bench.py: ShareGPT conversations), the server's default settings, a real SQLite
store in a temporary directory and the real group writer, at concurrency 1 and 8:

- `shift`: no chat id (nothing stored), the engine's path;
- `shift+chat`: a chat id (300 chats in turn), its audit encoded, compressed and committed before
  the reply;
- `no messages`: the same with `audit_messages = false` (the audit without the prompt's text, so
  less to encode and compress);
- `write answered`: the same as `shift+chat` with the store's `record_shifts` answering at once
  (nothing committed) on the Python writer thread: what is left is the chat's own path (its
  previous prompt, the writer thread's hand-off, the encoding). A decomposition, not a way to run.

The ratios to `shift` say how much of an audited call is the audit, and which part; each call's CPU
is also split by thread (`/proc/self/task`): the event loop's (the request, the shift, the reply,
and over SQLite the record: the payload, the chat's blocks and their compression), the Python
group writer's (the record and the transaction, where the store has no commits outside Python, or
for `write answered`) and the core's writer thread's (SQLite's transactions).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import ghz_bench, output  # noqa: E402
from benchmarks.proc_threads import cpu_seconds  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb  # noqa: E402
from contextshift.api import metrics  # noqa: E402
from contextshift.api.config import ServerConfig  # noqa: E402
from contextshift.api.config import load as load_config  # noqa: E402
from contextshift.api.service.gate import begin_call_stats  # noqa: E402
from contextshift.api.service.servicer import ContextShiftService  # noqa: E402
from contextshift.audit import open_store  # noqa: E402
from contextshift.audit.store import ShiftRecord, Store  # noqa: E402
from contextshift.audit.writer import CORE_WRITER_THREAD, WRITER_THREAD, GroupWriter, WriteOutcome  # noqa: E402
from contextshift.budget import Budget  # noqa: E402

KIB = 48
CHATS = 300
WARM_CALLS = 40  # per concurrent caller, not counted
MODES = ("shift", "shift+chat", "no messages", "write answered")


class _WriteAnswered:
    """A store whose `record_shifts` answers at once (nothing committed), with no group commits
    outside Python (every record goes to the writer thread); everything else is the real
    store's."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def record_shifts(self, records: list[ShiftRecord]) -> list[WriteOutcome]:
        return [None] * len(records)

    def core_groups(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _thread_seconds() -> dict[str, float]:
    """The CPU seconds (user + system) each of this process's Python threads has used, by its name,
    and the core's writer thread (not a Python thread: found by the name Linux keeps)."""
    seconds = {t.name: cpu_seconds(Path(f"/proc/self/task/{t.native_id}")) for t in threading.enumerate()}
    for task in Path("/proc/self/task").iterdir():
        if (task / "comm").read_text().strip() == CORE_WRITER_THREAD:
            seconds[CORE_WRITER_THREAD] = seconds.get(CORE_WRITER_THREAD, 0.0) + cpu_seconds(task)
    return seconds


def _requests(mode: str) -> list[bytes]:
    shift = pb.ShiftContextRequest(blocks_json=ghz_bench.blocks_json(KIB))
    if mode == "shift":
        return [shift.SerializeToString()]
    requests = []
    for n in range(CHATS):
        chat = pb.ShiftContextRequest(chat_id=f"chat-{n}")
        chat.MergeFrom(shift)
        requests.append(chat.SerializeToString())
    return requests


async def _measure(
    mode: str, concurrency: int, calls: int, config: ServerConfig, tmp: Path
) -> dict[str, Any]:
    store = metrics.timed_store(open_store(f"sqlite:///{tmp}/{mode}-{concurrency}.db", pool_size=2))
    store.migrate()
    writes_to = cast(Store, _WriteAnswered(store)) if mode == "write answered" else store
    requests = _requests(mode)
    with ThreadPoolExecutor(config.engine_threads) as executor:
        writer = GroupWriter(writes_to)
        service = ContextShiftService(
            executor,
            Budget(config.context_size, config.max_output_tokens),
            store,
            inline_request_bytes=config.inline_request_bytes,
            audit_messages=mode != "no messages",
            store_cache_seconds=config.store_cache_seconds,
            writer=writer,
        )

        async def caller(n: int, first: int, step: int = 1) -> None:
            for i in range(n):
                begin_call_stats()
                await service.ShiftContext(requests[(first + i * step) % len(requests)])

        # Not counted: every chat once (a chat's first call reads the store; after it, the process
        # holds the chat's last prompt, as a server that has run a while does), and at least
        # WARM_CALLS calls per caller.
        warm = max(WARM_CALLS, -(-len(requests) // concurrency))
        await asyncio.gather(*(caller(warm, k, concurrency) for k in range(concurrency)))
        per_caller = calls // concurrency
        before, threads_before, start = os.times(), _thread_seconds(), time.perf_counter()
        await asyncio.gather(*(caller(per_caller, k * 97) for k in range(concurrency)))
        after, threads_after, seconds = os.times(), _thread_seconds(), time.perf_counter() - start
        writer.close()
    store.close()
    done = per_caller * concurrency
    cpu = (after.user - before.user) + (after.system - before.system)
    return {
        "mode": mode,
        "concurrency": concurrency,
        "calls": done,
        "calls_per_s": done / seconds,
        "cpu_ms": 1e3 * cpu / done,
        "sys_ms": 1e3 * (after.system - before.system) / done,
        "loop_ms": 1e3 * _spent(threads_before, threads_after, threading.main_thread().name) / done,
        "writer_ms": 1e3 * _spent(threads_before, threads_after, WRITER_THREAD) / done,
        "core_writer_ms": 1e3 * _spent(threads_before, threads_after, CORE_WRITER_THREAD) / done,
    }


def _spent(before: dict[str, float], after: dict[str, float], thread: str) -> float:
    return after.get(thread, 0.0) - before.get(thread, 0.0)


def run(quick: bool) -> list[dict[str, Any]]:
    config = load_config({}, {})
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        for concurrency in (1, 8):
            for mode in MODES:
                rows.append(
                    asyncio.run(_measure(mode, concurrency, 400 if quick else 4000, config, Path(tmp_name)))
                )
    for row in rows:
        base = next(r for r in rows if r["mode"] == "shift" and r["concurrency"] == row["concurrency"])
        row["cpu_vs_shift"] = row["cpu_ms"] / base["cpu_ms"]
    return rows


COLUMNS = [
    output.Column("mode", "mode", 15),
    output.Column("concurrency", "concurrency", 11),
    output.Column("calls/s", "calls_per_s", 8, ".0f"),
    output.Column("CPU ms/call", "cpu_ms", 11, ".3f"),
    output.Column("of it system", "sys_ms", 12, ".3f"),
    output.Column("event loop", "loop_ms", 10, ".3f"),
    output.Column("writer", "writer_ms", 6, ".3f"),
    output.Column("core writer", "core_writer_ms", 11, ".3f"),
    output.Column("CPU vs shift", "cpu_vs_shift", 12, ".2f"),
]


def main(quick: bool = False) -> int:
    rows = run(quick)
    output.print_table(COLUMNS, rows)
    load = "load {:.2f}, {:.2f}, {:.2f} after the run".format(*os.getloadavg())
    output.publish("audit_cost", rows, [load])
    return 0


if __name__ == "__main__":
    output.command(main, __doc__, "smoke run: 400 calls per configuration")
