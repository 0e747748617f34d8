"""Images sent inline priced by their real size (docs/semantics.md §2.2): without a width and height
given, the core reads the size from the header of a PNG, JPEG, GIF or WebP image in a base64
`data:` URL (or an Anthropic base64 source), and the result says which size each image was priced
at and how it was known. The images are real encoders' files (tests/data/images, made by
make_images.py with Pillow, and a photograph matplotlib ships); their true size is read by Pillow,
a reader independent of the core's."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib import cbook
from PIL import Image

import contextshift
from contextshift import ImageCount

IMAGES = Path(__file__).parent / "data" / "images"
FILES = sorted(p for p in IMAGES.iterdir() if p.suffix != ".py")
# Its frame header lies past the 64 KiB the core decodes: of unknown size.
PAST_THE_BOUND = "jpeg_icc_640x480.jpg"
PHOTO = Path(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
FRAMING = 4  # every profile below frames a user message with 4 tokens


def data_url(path: Path, media_type: str = "image/png") -> str:
    # The media type is left wrong on purpose for most files: the bytes say what the image is.
    return f"data:{media_type};base64,{base64.b64encode(path.read_bytes()).decode()}"


def user(*parts: dict[str, Any], block_id: str | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"role": "user", "content": list(parts)}
    if block_id is not None:
        block["id"] = block_id
    return block


def chat_image(url: str, detail: str | None = None, **size: int) -> dict[str, Any]:
    image_url = {"url": url} | ({"detail": detail} if detail else {})
    return {"type": "image_url", "image_url": image_url} | size


def image_tokens(block: dict[str, Any], profile: str) -> int:
    return contextshift.count_tokens([block], profile)[0] - FRAMING


def test_the_test_images_are_what_their_names_say() -> None:
    assert len(FILES) == 12
    formats = set()
    for path in FILES:
        with Image.open(path) as image:
            assert f"_{image.width}x{image.height}." in path.name
            formats.add(image.format)
    assert formats == {"PNG", "JPEG", "GIF", "WEBP"}


@pytest.mark.parametrize("path", [*FILES, PHOTO], ids=lambda p: p.name)
@pytest.mark.parametrize(
    ("profile", "detail"),
    [("o200k_base", None), ("o200k_base", "low"), ("anthropic", None), ("heuristic", None)],
)
def test_an_image_sent_inline_costs_the_rule_at_its_true_size(
    path: Path, profile: str, detail: str | None
) -> None:
    with Image.open(path) as image:
        width, height = image.size
    inline = image_tokens(user(chat_image(data_url(path), detail)), profile)
    at_true_size = image_tokens(
        user(chat_image("https://example.com/x.png", detail, width=width, height=height)), profile
    )
    of_unknown_size = image_tokens(user(chat_image("https://example.com/x.png", detail)), profile)
    assert inline == (of_unknown_size if path.name == PAST_THE_BOUND else at_true_size)


# The rules' arithmetic at these sizes (docs/profiles.md): OpenAI high detail 85 + 170 per 512 px
# tile after fitting 2048 px and a 768 px shortest side; Anthropic w*h/750 after fitting 1568 px
# and 1.2 MP; 765 and 1600 for an unknown size.
MEASURED = {
    "png_512x512.png": (255, 350),  # 1 tile; 262144/750
    "jpeg_512x512.jpg": (255, 350),
    "webp_lossless_512x512.webp": (255, 350),
    "png_2048x1024.png": (1105, 1599),  # 1536x768: 6 tiles; 1549x774 (x0.7565)
    "jpeg_progressive_2048x1024.jpg": (1105, 1599),
    "gif_2048x1024.gif": (1105, 1599),
    "webp_lossy_2048x1024.webp": (1105, 1599),
    "jpeg_exif_1000x600.jpg": (765, 800),  # 2x2 tiles; 600000/750
    "webp_alpha_1000x600.webp": (765, 800),
    "jpeg_comment_800x600.jpg": (765, 640),
    "gif_300x200.gif": (255, 80),
    PAST_THE_BOUND: (765, 1600),  # unknown size
    "grace_hopper.jpg": (425, 410),  # 512x600: 1x2 tiles; 307200/750 rounded up
}


@pytest.mark.parametrize("path", [*FILES, PHOTO], ids=lambda p: p.name)
def test_measured_image_tokens(path: Path) -> None:
    block = user(chat_image(data_url(path), "high"))
    assert (image_tokens(block, "o200k_base"), image_tokens(block, "anthropic")) == MEASURED[path.name]


def test_every_shape_of_an_inline_image_is_read() -> None:
    path = IMAGES / "png_2048x1024.png"
    url, raw = data_url(path), base64.b64encode(path.read_bytes()).decode()
    shapes = [
        chat_image(url),  # OpenAI Chat; the typed API's images take this shape too
        {"type": "input_image", "image_url": url},  # OpenAI Responses
        {"type": "image", "image": url},  # Vercel AI SDK
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": raw}},  # Anthropic
    ]
    for part in shapes:
        assert image_tokens(user(part), "o200k_base") == 1105, part["type"]
    # By URL or file id, the size stays unknown; a size given is used as given.
    assert image_tokens(user({"type": "input_image", "file_id": "file-abc"}), "o200k_base") == 765
    assert image_tokens(user(chat_image("https://example.com/a.png")), "anthropic") == 1600
    assert image_tokens(user(chat_image(url, width=512, height=512)), "o200k_base") == 255


def test_the_result_says_what_size_each_kept_image_was_priced_at() -> None:
    png, gif = data_url(IMAGES / "png_2048x1024.png"), data_url(IMAGES / "gif_300x200.gif", "image/gif")
    blocks = [
        user(chat_image(png), block_id="old"),
        {"id": "a", "role": "assistant", "content": "seen"},
        user(
            chat_image(gif, "high"),
            chat_image("https://example.com/x.png"),
            chat_image(png, width=512, height=512),
            chat_image(data_url(IMAGES / PAST_THE_BOUND)),
            block_id="now",
        ),
    ]
    whole = contextshift.shift_context(blocks, budget=100_000, profile="o200k_base")
    assert whole.images == [
        ImageCount("old", 0, 1105, 2048, 1024, "header"),
        ImageCount("now", 0, 255, 300, 200, "header"),
        ImageCount("now", 1, 765, 0, 0, "unknown"),
        ImageCount("now", 2, 255, 512, 512, "given"),
        ImageCount("now", 3, 765, 0, 0, "unknown"),
    ]
    # Image tokens are part of the blocks' tokens.
    assert {d.id: d.tokens for d in whole.kept}["old"] == FRAMING + 1105
    # Only kept blocks' images are listed; the same from JSON text.
    cut = contextshift.shift_context(blocks, budget=2100, profile="o200k_base")
    assert [d.id for d in cut.excluded] == ["old", "a"]
    assert [i.id for i in cut.images] == ["now"] * 4
    assert (
        contextshift.shift_context(json.dumps(blocks), budget=2100, profile="o200k_base").images == cut.images
    )
    anthropic = contextshift.shift_context(blocks, budget=100_000, profile="anthropic")
    assert [(i.tokens, i.basis) for i in anthropic.images] == [
        (1599, "header"),
        (80, "header"),
        (1600, "unknown"),
        (350, "given"),
        (1600, "unknown"),
    ]
    assert contextshift.shift_context([user(block_id="text only")], budget=100).images == []
