"""The cost of the audit: ShiftContext with a `chat_id` (the shift, its audit encoded, compressed
and written to the store before the reply) next to ShiftContext without one, same server, same
payload, SQLite and PostgreSQL.

    python benchmarks/audit_bench.py [--quick]     (also run by benchmarks/run.py)

The server is the real `contextshift serve` (one worker) on 127.0.0.1, over a SQLite file in a
temporary folder (synchronous=normal, the default) and then over a throwaway PostgreSQL cluster
(tests/postgres_cluster.py: Debian's PostgreSQL 15; fsync off, as a test cluster). Clients are the
gRPC benchmark's (benchmarks/grpc_bench.py): separate processes, closed loop, the RPCs interleaved
in 1-second slices over the same connections. The payload is that benchmark's 200 messages (48 KiB
of JSON); audited calls cycle over 64 chats per client, so most replace a chat's last audit.

- `shift`: no chat; served on the event loop (a small request that needs nothing stored);
- `shift/model`: the same with `profile` set, which reads the model's configuration and calibration
  (a profile may name a model): from the process's read cache, on the event loop, once read; on the
  `sqlite/uncached` server (`--store-cache-seconds 0`) from the store on an engine thread every
  time, the cost the cache saves;
- `shift+audit`: with a `chat_id`: on the event loop once the process holds the chat's last prompt,
  and its audit written by the process's group writer before the reply.

Target (issue 9): the audit adds at most 30% to the p50 of ShiftContext on SQLite (`shift+audit`
against `shift`).
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from benchmarks import grpc_bench  # noqa: E402
from benchmarks.output import Column, command, print_table, publish  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2, context_service_pb2_grpc  # noqa: E402
from tests.integration.conftest import start_server  # noqa: E402
from tests.postgres_cluster import running_cluster  # noqa: E402

RPCS = ("shift", "shift/model", "shift+audit")
CHATS_PER_CLIENT = 64
TARGET = 0.30  # the audit's share of the p50 on SQLite, at most


def _variant(chat_id: str = "", profile: str = "") -> context_service_pb2.ShiftContextRequest:
    request = context_service_pb2.ShiftContextRequest(chat_id=chat_id, profile=profile)
    request.MergeFrom(grpc_bench.payload())
    return request


@functools.cache
def _audited_requests() -> list[context_service_pb2.ShiftContextRequest]:
    return [_variant(chat_id=f"bench-{os.getpid()}-{n}") for n in range(CHATS_PER_CLIENT)]


def _calls(channel: grpc.Channel) -> dict[str, grpc_bench.Call]:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    plain, with_model = grpc_bench.payload(), _variant(profile="heuristic")
    audited = itertools.cycle(_audited_requests())
    return {
        "shift": lambda: stub.ShiftContext(plain, timeout=10),
        "shift/model": lambda: stub.ShiftContext(with_model, timeout=10),
        "shift+audit": lambda: stub.ShiftContext(next(audited), timeout=10),
    }


def _measure(
    store: str, backend: str, clients: int, rounds: int, tmp: Path, *flags: str
) -> list[dict[str, Any]]:
    server = start_server(tmp, *flags, store=store)
    try:
        measured = grpc_bench.measure(server, _calls, clients, 1, rounds)
    finally:
        server.terminate()
    size = grpc_bench.payload_bytes()
    return [
        {"store": backend, "clients": clients, "payload_bytes": size, "rpc": rpc} | measured[rpc]
        for rpc in RPCS
    ]


def run(clients: int, rounds: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = _measure(f"sqlite:///{tmp}/bench.db", "sqlite", clients, rounds, Path(tmp))
        rows += _measure(
            f"sqlite:///{tmp}/uncached.db",
            "sqlite/uncached",
            clients,
            rounds,
            Path(tmp),
            "--store-cache-seconds",
            "0",
        )
        with running_cluster() as cluster:
            rows += _measure(cluster.new_database(), "postgresql", clients, rounds, Path(tmp))
    return rows


TABLE = (
    Column("store", "store", 16),
    Column("rpc", "rpc", 12),
    Column("calls", "calls", 7),
    Column("p50 ms", "p50_ms", 8, ".2f"),
    Column("p99 ms", "p99_ms", 8, ".2f"),
    Column("QPS", "qps", 8, ".0f"),
)


def report(rows: list[dict[str, Any]]) -> list[str]:
    """Prints the rows' table; returns the findings."""
    print_table(TABLE, rows)
    findings = []
    for store in ("sqlite", "sqlite/uncached", "postgresql"):
        plain, with_model, audited = (
            next(r for r in rows if r["store"] == store and r["rpc"] == rpc) for rpc in RPCS
        )
        added = audited["p50_ms"] / plain["p50_ms"] - 1
        verdict = (
            f" (target <= {TARGET:.0%}): {'PASS' if added <= TARGET else 'FAIL'}" if store == "sqlite" else ""
        )
        findings.append(
            f"{store}: the audit adds {added:.0%} to p50 ({plain['p50_ms']:.2f} -> {audited['p50_ms']:.2f} ms)"
            f"{verdict}; QPS {audited['qps'] / plain['qps']:.0%} of ShiftContext without a chat; against the "
            f"shift reading a model: p50 +{audited['p50_ms'] / with_model['p50_ms'] - 1:.0%}, "
            f"QPS {audited['qps'] / with_model['qps']:.0%}"
        )
    cached, uncached = (
        next(r for r in rows if r["store"] == store and r["rpc"] == "shift/model")
        for store in ("sqlite", "sqlite/uncached")
    )
    findings.append(
        f"read cache: a shift reading a model, p50 {uncached['p50_ms']:.2f} -> {cached['p50_ms']:.2f} ms, "
        f"QPS x{cached['qps'] / uncached['qps']:.2f}"
    )
    return findings


def main(quick: bool = False) -> int:
    size = len(grpc_bench.payload().blocks_json.encode())
    print(
        f"ShiftContext with and without its audit: {grpc_bench.MESSAGES} messages, {size / 1024:.1f} KiB of JSON"
    )
    rows = run(clients=2, rounds=1 if quick else 6)
    publish("audit", rows, report(rows))
    return 0


if __name__ == "__main__":
    command(main, __doc__, "smoke run: one round instead of six")
