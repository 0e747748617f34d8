"""Chats kept on their worker: the same two workers of one `contextshift serve --workers 2`, reached
two ways side by side in one run, ghz at concurrency 8 (48 KiB of real text per call, 300 chats
each, SQLite):

- `SO_REUSEPORT`: the shared port, the kernel spreading ghz's 4 connections over the workers;
- `HAProxy`: Debian's HAProxy with deploy/haproxy/haproxy.cfg as shipped (`tests/haproxy.py`) on
  the workers' own ports, hashing each call's `x-chat-id` header.

    python benchmarks/balancer_bench.py [--quick]     (also run by benchmarks/run.py)

ghz sends the requests of benchmarks/ghz_bench.py (`shift+chat`: each call replaces its chat's
audit, written before the reply), the n-th call the n-th chat's in turn, with the header naming the
same chat (`--metadata` with ghz's template functions: `mod .RequestNumber 300`). Each way has a
chat set of its own, so one way's calls never move the other's chats. Their slices alternate,
ROUNDS rounds of SLICE_SECONDS, each after a short warm-up that is not counted. The re-shifts
(`contextshift_reshifts_total`) and the audited calls (`contextshift_chat_prompts_total`: every
ShiftContext of a chat) are the server's own counts over each way's slices.

Targets (issue 35): behind HAProxy, re-shifts at most 1% of the audited calls (against the
SO_REUSEPORT share, side by side); HAProxy's calls/s at least 85% of SO_REUSEPORT's (the balancer's
own cost).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks import ghz_bench  # noqa: E402
from benchmarks.output import Column, command, print_table, run_and_publish  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2  # noqa: E402
from tests import haproxy  # noqa: E402
from tests.integration.conftest import free_ports, start_server  # noqa: E402

WAYS = ("SO_REUSEPORT", "HAProxy")
CONCURRENCY = 8
KIB = ghz_bench.TARGET_KIB
CHATS = 300
SLICE_SECONDS = 4.0
ROUNDS = 3
WARM_CALLS = 20
RESHIFT_TARGET = 0.01
CALLS_TARGET = 0.85


def chats_data(prefix: str) -> bytes:
    """`CHATS` ShiftContext requests of 48 KiB, the n-th naming chat `<prefix>-<n>`."""
    shift = context_service_pb2.ShiftContextRequest(blocks_json=ghz_bench.blocks_json(KIB))
    messages = []
    for n in range(CHATS):
        chat = context_service_pb2.ShiftContextRequest(chat_id=f"{prefix}-{n}")
        chat.MergeFrom(shift)
        messages.append(chat.SerializeToString())
    return ghz_bench._delimited(messages)


def header_template(prefix: str) -> str:
    """ghz metadata naming the chat of each call's request (ghz sends request n % CHATS)."""
    return json.dumps({"x-chat-id": f"{prefix}-{{{{mod .RequestNumber {CHATS}}}}}"})


def counts(metrics_url: str) -> dict[str, float]:
    """The server's re-shifts and audited calls so far, over its workers."""
    text = httpx.get(metrics_url, timeout=10).text
    found = {"reshifts": 0.0, "audited": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "contextshift_reshifts_total":
                found["reshifts"] += sample.value
            elif sample.name == "contextshift_chat_prompts_total":
                found["audited"] += sample.value
    return found


def run(quick: bool) -> list[dict[str, Any]]:
    rounds, seconds = (1, 1.0) if quick else (ROUNDS, SLICE_SECONDS)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = haproxy.consecutive_free_ports(4)  # the workers' gRPC ports, then their HTTP ports
        server = start_server(
            tmp,
            "--workers",
            "2",
            "--worker-port-base",
            str(base),
            "--worker-http-port-base",
            str(base + 2),
            "--drain-seconds",
            "0",
            store=f"sqlite:///{tmp}/balancer.db",
        )
        try:
            server.wait_serving(2)
            ports = free_ports(3)
            with haproxy.running(
                tmp, (ports[0], ports[1], ports[2]), [base, base + 1], [base + 2, base + 3]
            ) as lb:
                return _measure(
                    tmp,
                    {"SO_REUSEPORT": server.address, "HAProxy": lb.address},
                    server.http_url,
                    rounds,
                    seconds,
                )
        finally:
            server.terminate()


def _measure(
    tmp: Path, addresses: dict[str, str], http_url: str, rounds: int, seconds: float
) -> list[dict[str, Any]]:
    measured = {way: ghz_bench.Slices([]) for way in WAYS}
    server = {way: {"reshifts": 0.0, "audited": 0.0} for way in WAYS}
    data, metadata = {}, {}
    for way in WAYS:
        prefix = way.lower().replace("_", "")
        data[way] = tmp / f"{prefix}.bin"
        data[way].write_bytes(chats_data(prefix))
        metadata[way] = header_template(prefix)
    for _ in range(rounds):
        for way in WAYS:
            flags = ("--metadata", metadata[way])
            ghz_bench.ghz(
                addresses[way], "shift+chat", data[way], CONCURRENCY, "--total", str(WARM_CALLS), *flags
            )
            before = counts(f"{http_url}/metrics")
            report = ghz_bench.ghz(
                addresses[way], "shift+chat", data[way], CONCURRENCY, "--duration", f"{seconds}s", *flags
            )
            after = counts(f"{http_url}/metrics")
            for key in server[way]:
                server[way][key] += after[key] - before[key]
            measured[way].add(report)
    rows = []
    for way in WAYS:
        audited, reshifts = server[way]["audited"], server[way]["reshifts"]
        rows.append(
            {"way": way, "concurrency": CONCURRENCY, "kib": KIB}
            | ghz_bench.measured_row(measured[way])
            | {
                "audited": audited,
                "reshifts": reshifts,
                "reshift_share": reshifts / audited if audited else 0.0,
            }
        )
    return rows


TABLE = (
    Column("way", "way", 12),
    Column("conc", "concurrency", 4),
    Column("KiB", "kib", 4),
    *ghz_bench.MEASURED,
    Column("audited", "audited", 8, ".0f"),
    Column("re-shifts", "reshifts", 9, ".0f"),
    Column("share", "reshift_share", 6, ".1%"),
)


def report(rows: list[dict[str, Any]]) -> list[str]:
    """Prints the table; returns the findings against the targets."""
    print_table(TABLE, rows)
    by = {r["way"]: r for r in rows}
    reuse, lb = by["SO_REUSEPORT"], by["HAProxy"]
    ratio = lb["calls_per_s"] / reuse["calls_per_s"] if reuse["calls_per_s"] else 0.0
    errors = sum(r["errors"] for r in rows)
    return [
        f"calls that failed: {errors}: {'PASS' if errors == 0 else 'FAIL'}",
        f"re-shifts behind HAProxy: {lb['reshifts']:.0f} of {lb['audited']:.0f} audited calls = "
        f"{lb['reshift_share']:.2%} (target <= {RESHIFT_TARGET:.0%}): "
        f"{'PASS' if lb['reshift_share'] <= RESHIFT_TARGET else 'FAIL'}; under SO_REUSEPORT "
        f"{reuse['reshifts']:.0f} of {reuse['audited']:.0f} = {reuse['reshift_share']:.1%}",
        f"calls/s behind HAProxy: {lb['calls_per_s']:.0f} = {ratio:.0%} of SO_REUSEPORT's "
        f"{reuse['calls_per_s']:.0f} (target >= {CALLS_TARGET:.0%}): {'PASS' if ratio >= CALLS_TARGET else 'FAIL'}; "
        f"p50 {lb['p50_ms']:.2f} / {reuse['p50_ms']:.2f} ms",
    ]


def main(quick: bool = False) -> int:
    print(
        f"two workers behind HAProxy hashing x-chat-id vs SO_REUSEPORT: ghz ({ghz_bench.GHZ}), concurrency {CONCURRENCY}"
    )
    return run_and_publish("balancer", run, report, quick)


if __name__ == "__main__":
    command(main, __doc__, "smoke run: one round of 1 s slices")
