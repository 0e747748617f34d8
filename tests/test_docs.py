"""The generated reference is current: docs/api.md (from the .proto comments and the HTTP routes)
and the README's settings table (from contextshift.api.config); regenerate with `make docs`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_api_reference_and_settings_table_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_reference_documents_every_rpc_field_and_route() -> None:
    from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
    from contextshift.api.http import OPERATIONS

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for method in pb.DESCRIPTOR.services_by_name["ContextShiftService"].methods:
        assert f"`{method.name}`" in api
    for field in pb.ContextPlan.DESCRIPTOR.fields:
        assert f"| `{field.name}` |" in api
    for op in OPERATIONS:
        assert f"| `{op.http_method}` | `{op.path}` |" in api
