"""`contextshift serve` with a gate, so a test can hold a call in flight for as long as it needs,
whatever the machine's speed: each gated call touches `<gate>.entered`, then waits until the file
`<gate>` exists. The gate stands in front of the engine (every shift), or, with
CONTEXTSHIFT_TEST_GATE_AT=record_shift, in front of the store's write of the shifts' records (on
the group writer's thread, after the shift, before the transaction: the stores' commits outside
Python, which never pass there, are off). Test harness only; run as a script by `start_server`."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contextshift import cli
from contextshift.api.service import shift_rpc
from contextshift.audit.postgres import PostgresStore
from contextshift.audit.sql import SqlStore
from contextshift.audit.sqlite import SqliteStore

GATE = Path(os.environ["CONTEXTSHIFT_TEST_GATE"])


def gated(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def wait_then_call(*args: Any, **kwargs: Any) -> Any:
        GATE.with_suffix(".entered").touch()
        while not GATE.exists():
            time.sleep(0.01)
        return call(*args, **kwargs)

    return wait_then_call


if os.environ.get("CONTEXTSHIFT_TEST_GATE_AT") == "record_shift":
    SqlStore.record_shifts = gated(SqlStore.record_shifts)  # type: ignore[method-assign]
    for store in (SqliteStore, PostgresStore):
        store.core_groups = SqlStore.core_groups  # type: ignore[method-assign]
else:
    shift_rpc.shift_context = gated(shift_rpc.shift_context)  # the service calls the library from there
# Every call goes to the engine threads, where a held call leaves the event loop free.
sys.exit(cli.main(["serve", "--inline-request-bytes", "0", *sys.argv[1:]]))
