"""Images over gRPC (the real server): an image sent inline without a size is priced at the size in
its header, and the ContextPlan says, per kept image, the size it was priced at and how it was known
(`images`), as the library's result does; typed blocks and `blocks_json` alike."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import grpc

import contextshift
from contextshift import ImageCount
from contextshift._proto.contextshift.v1 import block_pb2, context_service_pb2_grpc
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb

from .conftest import ServerProcess

IMAGES = Path(__file__).parent.parent / "data" / "images"


def data_url(name: str) -> str:
    return f"data:image/png;base64,{base64.b64encode((IMAGES / name).read_bytes()).decode()}"


def test_the_plan_says_what_size_each_image_was_priced_at(
    channel: grpc.Channel, server: ServerProcess
) -> None:
    jpeg, webp = data_url("jpeg_progressive_2048x1024.jpg"), data_url("webp_lossless_512x512.webp")
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    typed = block_pb2.Block(
        id="look",
        role=block_pb2.ROLE_USER,
        parts=[
            block_pb2.Part(text="what is in these?"),
            block_pb2.Part(image=block_pb2.Image(url=jpeg, detail="high")),
            block_pb2.Part(image=block_pb2.Image(url=webp, width=100, height=100)),
            block_pb2.Part(image=block_pb2.Image(url="https://example.com/c.png")),
        ],
    )
    window = {"profile": "o200k_base", "context_limit": 100_000, "response_reserve": 0}
    plan = stub.PreviewContext(pb.PreviewContextRequest(blocks=[typed], **window), timeout=20).plan
    expected = [
        ("look", 0, 1105, 2048, 1024, "header"),
        ("look", 1, 255, 100, 100, "given"),  # given: its header is not read
        ("look", 2, 765, 0, 0, "unknown"),
    ]
    assert [(i.id, i.index, i.tokens, i.width, i.height, i.basis) for i in plan.images] == expected
    # The same blocks as JSON text, through ShiftContext and the Python client: the library's figures.
    blocks = [
        {
            "id": "look",
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in these?"},
                {"type": "image_url", "image_url": {"url": jpeg, "detail": "high"}},
                {"type": "image_url", "image_url": {"url": webp}, "width": 100, "height": 100},
                {"type": "image_url", "image_url": {"url": "https://example.com/c.png"}},
            ],
        }
    ]
    request = pb.ShiftContextRequest(blocks_json=json.dumps(blocks), **window)
    assert list(stub.ShiftContext(request, timeout=20).plan.images) == list(plan.images)
    library = contextshift.shift_context(blocks, budget=100_000, profile="o200k_base")
    assert library.images == [ImageCount(*i) for i in expected]
    with contextshift.Client(server.address) as client:
        remote = client.preview_context(blocks, profile="o200k_base", budget=100_000)
    assert remote.images == library.images
