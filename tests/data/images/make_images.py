"""Makes the test images of this folder with Pillow's encoders (libpng, libjpeg, libwebp and
Pillow's GIF writer): real files of known sizes, whose headers the core reads to price images sent
inline (docs/semantics.md §2.2). Committed; run again only to change them:

    .venv/bin/python tests/data/images/make_images.py

The name of each file says its size. `jpeg_comment_800x600.jpg` has its frame header 30 KB in;
`jpeg_icc_640x480.jpg` carries a 70 KB ICC profile before its frame header, past the 64 KiB the
core decodes, so its size is unknown to the core.
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, ImageDraw

HERE = Path(__file__).parent


def picture(width: int, height: int, mode: str = "RGB") -> Image.Image:
    """A flat picture with a few shapes: small files, still a real encoder's output."""
    image = Image.new(mode, (width, height), (40, 90, 160, 255)[: len(mode)])
    draw = ImageDraw.Draw(image)
    draw.rectangle((width // 8, height // 8, width // 2, height // 2), fill=(230, 200, 40, 200)[: len(mode)])
    draw.ellipse((width // 2, height // 3, width - 1, height - 1), fill=(200, 60, 60, 128)[: len(mode)])
    return image


def write(name: str, image: Image.Image, **options: object) -> None:
    out = io.BytesIO()
    image.save(out, **options)
    (HERE / name).write_bytes(out.getvalue())


def main() -> None:
    write("png_512x512.png", picture(512, 512), format="PNG", optimize=True)
    write("png_2048x1024.png", picture(2048, 1024, "RGBA"), format="PNG", optimize=True)
    write("jpeg_512x512.jpg", picture(512, 512), format="JPEG", quality=70)
    write("jpeg_progressive_2048x1024.jpg", picture(2048, 1024), format="JPEG", quality=50, progressive=True)
    # An EXIF segment (APP1) before the frame header, as a camera writes one.
    exif = Image.Exif()
    exif[0x010F] = "contextshift test"  # Make
    exif[0x0110] = "make_images.py"  # Model
    write("jpeg_exif_1000x600.jpg", picture(1000, 600), format="JPEG", quality=60, exif=exif.tobytes())
    # A 30 KB comment (COM) before the frame header: within the core's bound, read as it grows.
    write("jpeg_comment_800x600.jpg", picture(800, 600), format="JPEG", quality=50, comment=b"c" * 30_000)
    # 70 KB of ICC profile (two APP2 segments) before the frame header: past the core's bound.
    icc = b"\0" * 70_000
    write("jpeg_icc_640x480.jpg", picture(640, 480), format="JPEG", quality=50, icc_profile=icc)
    flat = {"palette": Image.Palette.ADAPTIVE, "colors": 8, "dither": Image.Dither.NONE}
    write("gif_300x200.gif", picture(300, 200).convert("P", **flat), format="GIF")
    write("gif_2048x1024.gif", picture(2048, 1024).convert("P", **flat), format="GIF")
    write("webp_lossy_2048x1024.webp", picture(2048, 1024), format="WEBP", quality=50)  # VP8
    write("webp_lossless_512x512.webp", picture(512, 512), format="WEBP", lossless=True)  # VP8L
    write("webp_alpha_1000x600.webp", picture(1000, 600, "RGBA"), format="WEBP", quality=50)  # VP8X


if __name__ == "__main__":
    main()
