"""`contextshift serve` with a gate in front of the engine, so a test can hold a call in flight
for as long as it needs, whatever the machine's speed: each shift touches `<gate>.entered`, then
waits until the file `<gate>` exists. Test harness only; run as a script by `start_server`."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import contextshift
from contextshift import cli

GATE = Path(os.environ["CONTEXTSHIFT_TEST_GATE"])
_shift_context = contextshift.shift_context


def gated_shift_context(*args: Any, **kwargs: Any) -> Any:
    GATE.with_suffix(".entered").touch()
    while not GATE.exists():
        time.sleep(0.01)
    return _shift_context(*args, **kwargs)


contextshift.shift_context = gated_shift_context  # the servicer calls it through the module
# Every call goes to the engine threads, where a held call leaves the event loop free.
sys.exit(cli.main(["serve", "--inline-request-bytes", "0", *sys.argv[1:]]))
