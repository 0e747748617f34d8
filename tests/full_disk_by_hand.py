"""The store on a full disk, for real: run by hand, as root (it mounts a filesystem), since CI may
not mount one; `tests/integration/test_store_pressure.py` runs the same sequence in CI with
`max_store_bytes` standing in for the disk. (`--reserve-bytes 0` shows why the reserve is there:
with none, the reports and deletions that need the journal fail with the disk.)

    sudo .venv/bin/python tests/full_disk_by_hand.py [--size-mib 3] [--reserve-bytes 1048576]

Mounts a tmpfs of `--size-mib` at a temporary folder, serves with its SQLite store there and
`--store-reserve-bytes`, and fills it with audited shifts of a 48 KiB chat until they are refused;
then checks that previews, audit reads, FinishGeneration and /healthz still work, that DeleteChat
works and makes room for the next audited shift, and that the file passes `contextshift store
check`. Prints what it saw; exits 1 when any of it did not hold. Unmounts at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import grpc  # noqa: E402

from benchmarks import grpc_bench  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc  # noqa: E402
from tests.integration.conftest import start_server  # noqa: E402

GAUGES = (
    "contextshift_store_bytes",
    "contextshift_store_chats",
    "contextshift_store_disk_free_bytes",
    "contextshift_store_full_total",
    "contextshift_chats_deleted_total",
)
Step = Callable[..., object]


def fill_then_make_room(stub: context_service_pb2_grpc.ContextShiftServiceStub, step: Step) -> None:
    chat = grpc_bench.payload()
    audited = 0
    while audited < 10_000:
        request = pb.ShiftContextRequest(blocks_json=chat.blocks_json, chat_id=f"chat-{audited}")
        try:
            stub.ShiftContext(request, timeout=10)
        except grpc.RpcError as e:
            print(
                f"{audited} audits of a {len(chat.blocks_json.encode()) / 1024:.1f} KiB chat fit; then {e.code().name}: {e.details()}"
            )
            break
        audited += 1
    request = pb.ShiftContextRequest(blocks_json=chat.blocks_json, chat_id="one-more")
    step(
        "a new audit is refused",
        lambda: stub.ShiftContext(request, timeout=10),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    # A block of the chat's size: the room left (less than one audit) is too small for it.
    big = pb.AppendBlocksRequest(
        chat_id="appended", blocks_json=json.dumps([{"role": "user", "content": chat.blocks_json}])
    )
    step(
        "AppendBlocks is refused",
        lambda: stub.AppendBlocks(big, timeout=10),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    preview = pb.PreviewContextRequest(blocks_json=chat.blocks_json)
    step("PreviewContext works", lambda: stub.PreviewContext(preview, timeout=10))
    read = pb.GetContextAuditRequest(chat_id="chat-0")
    audit = step("GetContextAudit works", lambda: stub.GetContextAudit(read, timeout=10))
    generation_id = audit.audit.generation_id if isinstance(audit, pb.GetContextAuditResponse) else ""
    finish = pb.FinishGenerationRequest(generation_id=generation_id, status=pb.GENERATION_STATUS_COMPLETED)
    step("FinishGeneration works", lambda: stub.FinishGeneration(finish, timeout=10))
    step("DeleteChat works", lambda: stub.DeleteChat(pb.DeleteChatRequest(chat_id="chat-1"), timeout=10))
    step("then the new audit succeeds", lambda: stub.ShiftContext(request, timeout=10))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=3)
    parser.add_argument("--reserve-bytes", type=int, default=1024 * 1024)
    args = parser.parse_args()
    failures: list[str] = []

    def step(what: str, call: Callable[[], object], expected: grpc.StatusCode | None = None) -> object:
        """Runs `call`; it holds when it succeeds (or fails with `expected`)."""
        try:
            result = call()
            holds, seen = expected is None, "ok"
        except grpc.RpcError as e:
            result, holds, seen = None, e.code() == expected, f"{e.code().name}: {e.details()}"
        print(f"{'held  ' if holds else 'FAILED'} {what} ({seen[:300]})")
        if not holds:
            failures.append(what)
        return result

    with tempfile.TemporaryDirectory(prefix="contextshift-full-") as folder:
        disk = Path(folder) / "disk"
        disk.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={args.size_mib}m", "tmpfs", str(disk)], check=True
        )
        try:
            url = f"sqlite:///{disk}/store.db"
            server = start_server(Path(folder), "--store-reserve-bytes", str(args.reserve_bytes), store=url)
            try:
                with grpc.insecure_channel(server.address) as channel:
                    fill_then_make_room(context_service_pb2_grpc.ContextShiftServiceStub(channel), step)
                with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=10) as answer:
                    step("/healthz answers 200", lambda: answer.status == 200 or 1 / 0)
                with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as answer:
                    exposition = answer.read().decode().splitlines()
                print("\n".join(line for line in exposition if line.startswith(GAUGES)))
            finally:
                step("the server stops cleanly", lambda: server.terminate() == 0 or 1 / 0)
            checked = subprocess.run(
                [sys.executable, "-m", "contextshift", "store", "check", "--store", url],
                capture_output=True,
                text=True,
            )
            print(checked.stdout.strip() or checked.stderr.strip())
            step("contextshift store check: ok", lambda: checked.returncode == 0 or 1 / 0)
            print(subprocess.run(["df", "-k", str(disk)], capture_output=True, text=True).stdout.strip())
        finally:
            subprocess.run(["umount", str(disk)], check=True)
    print("held" if not failures else f"did not hold: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
