"""What one audit of a 48 KiB chat takes in the store, measured through the real server.

    python benchmarks/store_bytes.py [--quick]     (also run by benchmarks/run.py)

`contextshift serve` on 127.0.0.1 over a SQLite file in a temporary folder, then over a throwaway
PostgreSQL cluster (tests/postgres_cluster.py); N audited ShiftContext calls, each for a chat of
its own, of one 48 KiB chat (everything fits the default budget, so the audit keeps every message),
and the store's figures before and after, per audit:

- `counted`: what `max_store_bytes` counts (`contextshift store check`'s data): SQLite's pages in
  use; PostgreSQL's bytes of audit payloads and history blocks;
- `on disk`: SQLite's database file once its WAL is folded in (the server stopped); PostgreSQL's
  tables with their indexes and TOAST (`pg_total_relation_size`), after a VACUUM.

Two chats: real text (Python standard library sources: code, English docstrings and comments),
and the generated chat of the gRPC and audit benchmarks (a few dozen words, some of them
non-ASCII, drawn at random: it compresses less); and the real one again with
`--no-audit-messages`, which keeps no message text.
"""

from __future__ import annotations

import itertools
import json
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import psycopg  # noqa: E402

from benchmarks import grpc_bench, output  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2, context_service_pb2_grpc  # noqa: E402
from contextshift.audit import open_store  # noqa: E402
from tests.integration.conftest import start_server  # noqa: E402
from tests.postgres_cluster import running_cluster  # noqa: E402

CHAT_BYTES = 48 * 1024
TABLES = ("generations", "audits", "calibrations", "chat_blocks", "chat_block_counts", "chat_histories")


def real_chat() -> str:
    """A chat of real text, at most 48 KiB of JSON: alternating user and assistant messages of
    200 to 600 bytes, consecutive slices of the Python standard library's sources (code and its
    English docstrings and comments), as a coding agent's chat holds."""
    text = "\n".join(
        path.read_text("utf-8", errors="replace")
        for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    )
    blocks: list[dict[str, Any]] = []
    start = 0
    for i in itertools.count():
        length = 200 + (i * 7919) % 400
        block = {"role": "user" if i % 2 == 0 else "assistant", "content": text[start : start + length]}
        if len(json.dumps([*blocks, block], ensure_ascii=False).encode()) > CHAT_BYTES:
            return json.dumps(blocks, ensure_ascii=False)
        blocks.append(block)
        start += length
    raise AssertionError("not reached")


def _disk_bytes(url: str, tmp: Path) -> int:
    if url.startswith("sqlite"):
        return (tmp / "store.db").stat().st_size
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("VACUUM")
        total = 0
        for table in TABLES:
            ((size,),) = connection.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchall()
            total += int(size)
        return total


def _counted(url: str) -> int:
    store = open_store(url)
    try:
        return store.usage().data_bytes
    finally:
        store.close()


def _per_audit(url: str, tmp: Path, chat: str, audits: int, flags: tuple[str, ...]) -> tuple[float, float]:
    """Bytes per audit (counted, on disk) of `audits` audited shifts of `chat` on a new server."""
    server = start_server(tmp, *flags, store=url)
    try:
        counted_before, disk_before = _counted(url), _disk_bytes(url, tmp)
        with grpc.insecure_channel(server.address) as channel:
            stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
            for n in range(audits):
                request = context_service_pb2.ShiftContextRequest(blocks_json=chat, chat_id=f"chat-{n}")
                stub.ShiftContext(request, timeout=30)
        counted = _counted(url) - counted_before
    finally:
        server.terminate()  # SQLite: its WAL folded into the file
    return counted / audits, (_disk_bytes(url, tmp) - disk_before) / audits


def measure(audits: int) -> list[dict[str, Any]]:
    chats = {"real text": real_chat(), "generated": grpc_bench.payload().blocks_json}
    cases: list[tuple[str, str, tuple[str, ...]]] = [(name, chat, ()) for name, chat in chats.items()]
    cases.append(("real text, no messages", chats["real text"], ("--no-audit-messages",)))
    rows = []
    with running_cluster() as cluster:
        for name, chat, flags in cases:
            for backend in ("sqlite", "postgresql"):
                with tempfile.TemporaryDirectory() as folder:
                    tmp = Path(folder)
                    url = f"sqlite:///{tmp}/store.db" if backend == "sqlite" else cluster.new_database()
                    counted, disk = _per_audit(url, tmp, chat, audits, flags)
                rows.append(
                    {
                        "chat": name,
                        "chat_bytes": len(chat.encode()),
                        "store": backend,
                        "audits": audits,
                        "counted_bytes_per_audit": counted,
                        "disk_bytes_per_audit": disk,
                    }
                )
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    print(f"{'chat':>24} {'KiB':>6} {'store':>11} {'audits':>7} {'counted KiB':>12} {'on disk KiB':>12}")
    for r in rows:
        print(
            f"{r['chat']:>24} {r['chat_bytes'] / 1024:6.1f} {r['store']:>11} {r['audits']:>7} "
            f"{r['counted_bytes_per_audit'] / 1024:12.1f} {r['disk_bytes_per_audit'] / 1024:12.1f}"
        )
    return [
        f"{r['chat']} ({r['chat_bytes'] / 1024:.1f} KiB), {r['store']}: {r['counted_bytes_per_audit'] / 1024:.1f} KiB "
        f"counted, {r['disk_bytes_per_audit'] / 1024:.1f} KiB on disk per audit"
        for r in rows
    ]


def main(quick: bool = False) -> int:
    rows = measure(audits=50 if quick else 400)
    output.save("store_bytes", rows, report(rows))
    return 0


if __name__ == "__main__":
    output.command(main, __doc__, "smoke run: 50 audits instead of 400")
