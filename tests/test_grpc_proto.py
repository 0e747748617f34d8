"""The committed generated code and docs match their sources (regenerate with `make proto`, `make docs`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "script",
    [
        "proto/generate_python.py",  # the protobuf code under service/contextshift/_proto
        "docs/generate.py",  # docs/api.md and docs/configuration.md's settings table
    ],
)
def test_generated_files_are_current(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), "--check"],
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
