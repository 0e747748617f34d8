"""End-to-end gRPC benchmark: unary ShiftContext next to an echo of the same payload, same server.

    python benchmarks/grpc_bench.py [--quick]     (also run by benchmarks/run.py)

The server is the real `contextshift serve` (with --bench-echo) on 127.0.0.1, with 1 and then 2
worker processes; clients are separate processes (closed loop, one call at a time each, a fresh
connection per process), bounded in time. The payload is a 200-message chat (~40 KB of JSON) sent
as `blocks_json` with the default budget. Echo parses the same request message and returns its
payload, as a servicer on the generated code does: the floor of a unary call through this server
(same interceptor, same logging), and the baseline of the targets (issue 3): ShiftContext p50
within 1.5x of echo p50, and QPS at least 60% of echo QPS. EchoBytes returns the request's bytes
unparsed, as ShiftContext is served without (de)serializers: the floor of gRPC itself, reported
beside the targets.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from benchmarks.conversation import generate  # noqa: E402
from contextshift._proto.contextshift.bench.v1 import echo_service_pb2, echo_service_pb2_grpc  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2, context_service_pb2_grpc  # noqa: E402
from tests.integration.conftest import start_server  # noqa: E402

# echo: a servicer on the generated code (parse, copy, serialize), the baseline;
# echo-bytes: the request's bytes sent back unparsed, the floor of gRPC itself (information).
RPCS = ("echo", "echo-bytes", "shift")
MESSAGES = 200
TEXT_CHARS = 170  # each message's text is cut to this, for a ~40 KB chat


def payload() -> context_service_pb2.ShiftContextRequest:
    blocks = generate(MESSAGES)
    for block in blocks:
        block["content"] = block["content"][:TEXT_CHARS]
    return context_service_pb2.ShiftContextRequest(blocks_json=json.dumps(blocks, ensure_ascii=False))


def _client(address: str, rpc: str, seconds: float, results: Any) -> None:
    """One client process: calls back to back for `seconds`, then reports its latencies."""
    request = payload()
    with grpc.insecure_channel(address) as channel:
        call: Callable[[], object]
        if rpc == "echo":
            echo = echo_service_pb2_grpc.EchoServiceStub(channel)
            message = echo_service_pb2.EchoRequest(payload=request)

            def call() -> object:
                return echo.Echo(message, timeout=10)
        elif rpc == "echo-bytes":
            echo = echo_service_pb2_grpc.EchoServiceStub(channel)
            raw = echo_service_pb2.EchoBytesRequest(payload=request)

            def call() -> object:
                return echo.EchoBytes(raw, timeout=10)
        else:
            stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)

            def call() -> object:
                return stub.ShiftContext(request, timeout=10)

        for _ in range(20):  # warm the connection and the server's caches
            call()
        latencies = []
        end = time.perf_counter() + seconds
        while (start := time.perf_counter()) < end:
            call()
            latencies.append(time.perf_counter() - start)
    results.put(latencies)


def measure(address: str, rpc: str, clients: int, seconds: float) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")  # no gRPC state is inherited by the clients
    results = context.Queue()
    procs = [context.Process(target=_client, args=(address, rpc, seconds, results)) for _ in range(clients)]
    for p in procs:
        p.start()
    latencies = [x for _ in procs for x in results.get(timeout=seconds + 120)]
    for p in procs:
        p.join(30)
    latencies.sort()
    return {
        "rpc": rpc,
        "calls": len(latencies),
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "qps": len(latencies) / seconds,
    }


def run(workers_list: list[int], clients: int, seconds: float) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in workers_list:
            server = start_server(Path(tmp), "--bench-echo", "--workers", str(workers))
            try:
                for rpc in RPCS:
                    rows.append(
                        {"workers": workers, "clients": clients}
                        | measure(server.address, rpc, clients, seconds)
                    )
            finally:
                server.terminate()
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    print(f"{'workers':>7} {'rpc':>10} {'calls':>7} {'p50 ms':>8} {'p99 ms':>8} {'QPS':>8}")
    for r in rows:
        print(
            f"{r['workers']:>7} {r['rpc']:>10} {r['calls']:>7} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['qps']:8.0f}"
        )
    findings = []
    for workers in sorted({r["workers"] for r in rows}):
        echo, echo_bytes, shift = (
            next(r for r in rows if r["workers"] == workers and r["rpc"] == rpc) for rpc in RPCS
        )
        p50 = shift["p50_ms"] / echo["p50_ms"]
        qps = shift["qps"] / echo["qps"]
        findings.append(
            f"{workers} worker(s): shift/echo p50 {p50:.2f}x (target <= 1.5x): {'PASS' if p50 <= 1.5 else 'FAIL'}; "
            f"QPS {qps:.0%} of echo (target >= 60%): {'PASS' if qps >= 0.6 else 'FAIL'}; "
            f"against echo-bytes: p50 {shift['p50_ms'] / echo_bytes['p50_ms']:.2f}x, "
            f"QPS {shift['qps'] / echo_bytes['qps']:.0%}"
        )
    for line in findings:
        print(line)
    return findings


def main(quick: bool = False) -> int:
    size = len(payload().blocks_json.encode())
    print(f"gRPC ShiftContext vs echo: {MESSAGES} messages, {size / 1024:.1f} KiB of JSON")
    rows = run([1, 2], clients=2, seconds=1.0 if quick else 8.0)
    findings = report(rows)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "grpc.json").write_text(
        json.dumps({"payload_bytes": size, "rows": rows, "findings": findings}, indent=2)
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: one second per measurement")
    raise SystemExit(main(parser.parse_args().quick))
