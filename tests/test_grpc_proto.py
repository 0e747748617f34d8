"""The committed generated code matches the .proto (regenerate with `make proto`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_python_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate_python.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_generated_imports_point_into_the_package() -> None:
    from contextshift._proto.contextshift.v1 import context_service_pb2

    assert context_service_pb2.DESCRIPTOR.package == "contextshift.v1"
    assert context_service_pb2.ShiftContextRequest.__module__.startswith("contextshift._proto.")
