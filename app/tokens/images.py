"""Tokens of an image content part, by OpenAI's rule: its `detail` and, when a data: URL's
header gives it, its size."""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping
from typing import Any

from inflight.tokens.encodings import bare_model

# Images (OpenAI's rule): `low` costs the base; `high`/`auto` the base plus one tile per 512 px
# square after fitting into 2048 px and scaling the short side to 768 px. The size is read from
# a data: URL's PNG/GIF/JPEG header; for a remote URL it is unknown and a 1920×1080 screenshot
# (6 tiles, 1105 tokens) is assumed — the common large case, so the estimate errs high.
IMAGE_BASE, IMAGE_TILE = 85, 170
IMAGE_BASE_MINI, IMAGE_TILE_MINI = 2833, 5667  # gpt-4o-mini counts images at these rates
IMAGE_UNKNOWN_SIZE = (1920, 1080)


def _image_size(url: Any) -> tuple[int, int] | None:
    """Width and height from the header of a base64 data: URL (PNG, GIF, JPEG), else None."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url[:100]:
        return None
    head = url.split(",", 1)[1][:87_380]  # the first 64 KiB of the file: where JPEG says SOF
    try:
        data = base64.b64decode(head[: len(head) - len(head) % 4])
    except (binascii.Error, ValueError):
        return None
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    i = 2 if data[:2] == b"\xff\xd8" else len(data)
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return int(width), int(height)
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    return None


def image_tokens(part: Mapping[str, Any], model: str) -> int:
    """Tokens of one image content part, by `detail` and (when known) size."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image or part.get("url")
    detail = image.get("detail") if isinstance(image, dict) else part.get("detail")
    mini = bare_model(model).startswith("gpt-4o-mini")
    base, tile = (IMAGE_BASE_MINI, IMAGE_TILE_MINI) if mini else (IMAGE_BASE, IMAGE_TILE)
    if detail == "low":
        return base
    width, height = _image_size(url) or IMAGE_UNKNOWN_SIZE
    if width <= 0 or height <= 0:
        return base
    fit = min(1.0, 2048 / max(width, height))
    short = min(1.0, 768 / (min(width, height) * fit))
    w, h = width * fit * short, height * fit * short
    return base + tile * math.ceil(w / 512) * math.ceil(h / 512)
