"""End-to-end gRPC benchmark: unary ShiftContext next to echoes of the same payload, same server.

    python benchmarks/grpc_bench.py [--quick]     (also run by benchmarks/run.py)

The server is the real `contextshift serve` (with --bench-echo) on 127.0.0.1, with 1 and then 2
worker processes; clients are separate processes (closed loop, one call at a time each, one
connection per worker process, round-robin), bounded in time. Each client measures every RPC in
turn over the same connections, in step with the others, so the RPCs compare under the same spread
of connections over the workers; the table shows that spread, from the server's log. The payloads
are a 200-message chat (48 KiB of JSON), a 400-message one (96 KiB) and a 1600-message one (397
KiB: above `inline_request_bytes`, so its shift runs on an engine thread; for information), sent
as `blocks_json` with the default budget; all sizes are measured in the same run, on the same
servers. EchoBytes returns the request's bytes unparsed, as ShiftContext is served without
(de)serializers: the floor of gRPC itself, and the baseline of the targets (issue #12):
ShiftContext p50 within 1.5x of echo-bytes p50, and QPS at least 60% of echo-bytes QPS, at 48 and
96 KiB. Echo parses the same request message and returns its payload, as a servicer on the
generated code does (same interceptor, same logging): reported beside the targets. The server's
own time for each shift, and the shift's own time in it, are the medians of its log lines.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from benchmarks import output  # noqa: E402
from benchmarks.conversation import generate  # noqa: E402
from contextshift._proto.contextshift.bench.v1 import echo_service_pb2, echo_service_pb2_grpc  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2, context_service_pb2_grpc  # noqa: E402
from tests.integration.conftest import ServerProcess, start_server  # noqa: E402

# echo-bytes: the request's bytes sent back unparsed, the floor of gRPC itself (the issue's
# baseline); echo: a servicer on the generated code (parse, copy, serialize), for information.
RPCS = ("echo", "echo-bytes", "shift")
MESSAGES = 200  # the payload of the audit benchmark, and the smaller one here
TARGET_SIZES = (MESSAGES, 400)  # 48 KiB and 96 KiB of JSON, where the targets are set
SIZES = (*TARGET_SIZES, 1600)  # and 397 KiB: above inline_request_bytes (256 KiB), on a thread
Call = Callable[[], object]
ROUND_SECONDS = 1.0  # each RPC's slice of a round
TEXT_CHARS = 170  # each message's text is cut to this, for 48 KiB of JSON per 200 messages


@functools.cache
def payload(messages: int = MESSAGES) -> context_service_pb2.ShiftContextRequest:
    blocks = generate(messages)
    for block in blocks:
        block["content"] = block["content"][:TEXT_CHARS]
    return context_service_pb2.ShiftContextRequest(blocks_json=json.dumps(blocks, ensure_ascii=False))


def payload_bytes(messages: int = MESSAGES) -> int:
    """The size of the request ShiftContext gets (the echoes' requests wrap it in one field)."""
    return payload(messages).ByteSize()


def _key(rpc: str, messages: int) -> str:
    """The name a client measures an RPC at a payload size under."""
    return f"{rpc}@{messages}"


METHODS = {
    "echo": "/contextshift.bench.v1.EchoService/Echo",
    "echo-bytes": "/contextshift.bench.v1.EchoService/EchoBytes",
    "shift": "/contextshift.v1.ContextShiftService/ShiftContext",
}


def _calls(channel: grpc.Channel) -> dict[str, Call]:
    echo = echo_service_pb2_grpc.EchoServiceStub(channel)
    shift = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    calls: dict[str, Call] = {}
    for messages in SIZES:
        request = payload(messages)
        echo_request = echo_service_pb2.EchoRequest(payload=request)
        bytes_request = echo_service_pb2.EchoBytesRequest(payload=request)
        calls[_key("echo", messages)] = functools.partial(echo.Echo, echo_request, timeout=10)
        calls[_key("echo-bytes", messages)] = functools.partial(echo.EchoBytes, bytes_request, timeout=10)
        calls[_key("shift", messages)] = functools.partial(shift.ShiftContext, request, timeout=10)
    return calls


# The calls a client measures, by name, over one channel; a module-level function (client
# processes are spawned, and get it by reference).
CallsFactory = Callable[[grpc.Channel], dict[str, Call]]


def _client(
    address: str, connections: int, rounds: int, start: Any, results: Any, make_calls: CallsFactory
) -> None:
    """One client process: `rounds` rounds in which each RPC in turn, in step with the other
    clients, is called back to back for a second, round-robin over `connections` connections.
    Interleaving the RPCs gives them the same machine conditions over time, and using the same
    connections gives them the same spread of connections over the worker processes (the kernel
    assigns each connection to a worker once)."""
    # A local subchannel pool: each channel opens its own connection.
    channels = [
        grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(connections)
    ]
    try:
        made = [make_calls(channel) for channel in channels]
        per_rpc = {rpc: [calls[rpc] for calls in made] for rpc in made[0]}
        for _ in range(10):  # warm the connections and the server's caches
            for calls in per_rpc.values():
                for call in calls:
                    call()
        latencies: dict[str, list[float]] = {rpc: [] for rpc in per_rpc}
        for _ in range(rounds):
            for rpc, calls in per_rpc.items():
                start.wait()
                measured = latencies[rpc]
                end = time.perf_counter() + ROUND_SECONDS
                while (begin := time.perf_counter()) < end:
                    calls[len(measured) % connections]()
                    measured.append(time.perf_counter() - begin)
        results.put(latencies)
    finally:
        for channel in channels:
            channel.close()


def _split(log: list[dict[str, Any]], rpc: str) -> str:
    """The shares of the RPC's calls each worker process served, from the server's log lines (both
    payload sizes: every call of a client goes over the same connections)."""
    pids = Counter(line["pid"] for line in log if line.get("method") == METHODS[rpc])
    total = sum(pids.values())
    return "/".join(f"{100 * n / total:.0f}" for n in sorted(pids.values(), reverse=True))


def _server_side(log: list[dict[str, Any]], messages: int) -> dict[str, float]:
    """The median, over the ShiftContext calls of `messages` messages, of the server's own time
    for the call (from its interceptor to its answer) and of the shift's own time in it, from the
    server's log lines: the rest of the call's time is gRPC, the hops between threads and the
    client."""
    blocks = len(json.loads(payload(messages).blocks_json))
    lines = [line for line in log if line.get("method") == METHODS["shift"] and line.get("blocks") == blocks]
    return {
        "server_ms": statistics.median(line["duration_ms"] for line in lines),
        "shift_ms": statistics.median(line["shift_ms"] for line in lines),
    }


def measure(
    server: ServerProcess, make_calls: CallsFactory, clients: int, connections: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """Runs `clients` client processes against `server` (see `_client`); per RPC: calls, p50 and
    p99 latency, QPS."""
    context = multiprocessing.get_context("spawn")  # no gRPC state is inherited by the clients
    start, results = context.Barrier(clients), context.Queue()
    procs = [
        context.Process(
            target=_client, args=(server.address, connections, rounds, start, results, make_calls)
        )
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    seconds = rounds * ROUND_SECONDS  # per RPC
    latencies: dict[str, list[float]] = {}
    for _ in range(clients):
        for rpc, found in results.get(timeout=10 * seconds + 120).items():
            latencies.setdefault(rpc, []).extend(found)
    for p in procs:
        p.join(30)
    measured = {}
    for rpc, found in latencies.items():
        ordered = sorted(found)
        measured[rpc] = {
            "calls": len(ordered),
            "p50_ms": statistics.median(ordered) * 1e3,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
            "qps": len(ordered) / seconds,
        }
    return measured


def run(workers_list: list[int], clients: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in workers_list:
            server = start_server(Path(tmp), "--bench-echo", "--workers", str(workers))
            try:
                server.wait_serving(workers)
                measured = measure(server, _calls, clients, workers, rounds)
                log = server.log_lines()  # read once: a full run logs tens of thousands of calls
                for messages in SIZES:
                    for rpc in RPCS:
                        rows.append(
                            {"workers": workers, "clients": clients, "payload_bytes": payload_bytes(messages)}
                            | {"rpc": rpc}
                            | measured[_key(rpc, messages)]
                            | {"split": _split(log, rpc)}
                            | (_server_side(log, messages) if rpc == "shift" else {})
                        )
            finally:
                server.terminate()
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    print(
        f"{'workers':>7} {'KiB':>5} {'rpc':>10} {'calls':>7} {'p50 ms':>8} {'p99 ms':>8} {'QPS':>8}"
        "  calls per worker %"
    )
    for r in rows:
        print(
            f"{r['workers']:>7} {r['payload_bytes'] / 1024:5.1f} {r['rpc']:>10} {r['calls']:>7}"
            f" {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['qps']:8.0f}  {r['split']}"
        )
    findings = []
    for workers, size in sorted({(r["workers"], r["payload_bytes"]) for r in rows}):
        echo, echo_bytes, shift = (
            next(r for r in rows if (r["workers"], r["payload_bytes"], r["rpc"]) == (workers, size, rpc))
            for rpc in RPCS
        )
        p50 = shift["p50_ms"] / echo_bytes["p50_ms"]
        qps = shift["qps"] / echo_bytes["qps"]
        targeted = size in {payload_bytes(m) for m in TARGET_SIZES}
        p50_verdict = f"(target <= 1.5x): {'PASS' if p50 <= 1.5 else 'FAIL'}" if targeted else "(no target)"
        qps_verdict = f"(target >= 60%): {'PASS' if qps >= 0.6 else 'FAIL'}" if targeted else "(no target)"
        findings.append(
            f"{workers} worker(s), {size / 1024:.0f} KiB: shift/echo-bytes p50 {p50:.2f}x {p50_verdict}; "
            f"QPS {qps:.1%} of echo-bytes {qps_verdict}; shift p99 {shift['p99_ms']:.2f} ms "
            f"(echo-bytes {echo_bytes['p99_ms']:.2f}); against echo: p50 {shift['p50_ms'] / echo['p50_ms']:.2f}x, "
            f"QPS {shift['qps'] / echo['qps']:.0%}; in the server (p50): the call {shift['server_ms']:.2f} ms, "
            f"the shift's own time {shift['shift_ms']:.2f} ms"
        )
    for line in findings:
        print(line)
    return findings


def main(quick: bool = False) -> int:
    sizes = ", ".join(f"{n} messages ({payload_bytes(n) / 1024:.1f} KiB)" for n in SIZES)
    print(f"gRPC ShiftContext vs echo-bytes and echo: {sizes}")
    rows = run([1, 2], clients=2, rounds=1 if quick else 8)
    output.save("grpc", rows, report(rows))
    return 0


if __name__ == "__main__":
    output.command(main, __doc__, "smoke run: one round instead of eight")
