"""docs/api.md documents the whole API (that it is current is tested with the generated code, in
test_grpc_proto.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
