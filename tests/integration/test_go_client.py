"""The contract from another language: Go code generated from the same .proto (buf generate with
the pinned plugins `make go-tools` installs) calls the real server and decodes its error details."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import ServerProcess

GO_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "go"
TOOLS = Path(sys.executable).parent  # make go-tools installs buf and the plugins beside python


def test_go_client_calls_shift_context_and_decodes_budget_error(server: ServerProcess) -> None:
    go = shutil.which("go")
    assert go, "Go is needed for the cross-language client test (see the Makefile)"
    assert (TOOLS / "buf").exists(), "run `make go-tools` (buf and the protoc-gen-go plugins)"
    env = os.environ | {
        "PATH": f"{TOOLS}{os.pathsep}{os.environ['PATH']}",
        "CONTEXTSHIFT_ADDR": server.address,
    }
    subprocess.run([str(TOOLS / "buf"), "generate"], cwd=GO_CLIENT, env=env, check=True, timeout=120)
    proc = subprocess.run(
        [go, "test", "-count=1", "-v", "./..."],
        cwd=GO_CLIENT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in (
        "TestShiftContextKeepsWhatFits",
        "TestShiftContextBudgetExceededCarriesErrorInfo",
        "TestBadBlockNamesTheField",
        "TestChatIdHeaderMustNameTheBodysChat",
    ):
        assert f"--- PASS: {name}" in proc.stdout
