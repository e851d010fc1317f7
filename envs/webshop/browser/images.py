"""Decoded images: what a browser holds for every ``<img>`` of a page it shows.

Owns: fetching a page's images, decoding them (Pillow) and scaling them to their displayed size in device pixels
(``width``/``height`` attributes times the device scale factor), as RGBA arrays kept with the page in the
back/forward cache. A real browser's decoded-image memory is per page and per device pixel; this is the part of a
browsing workspace's private memory that differs between two samples looking at different products.
Must never: fail a page because an image is broken or missing: the image is skipped, as a browser shows a
placeholder.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image, UnidentifiedImageError

from . import dom

MAX_SIDE = 4096  # device pixels: a hostile width/height attribute cannot make us allocate gigabytes


def _size(node: dom.Node, natural: tuple[int, int], scale: float) -> tuple[int, int]:
    def attr(name: str, default: int) -> int:
        try:
            return max(1, int(node.attrs.get(name) or default))
        except ValueError:
            return default
    width, height = attr("width", natural[0]), attr("height", natural[1])
    return min(MAX_SIDE, max(1, round(width * scale))), min(MAX_SIDE, max(1, round(height * scale)))


def decode_images(document: dom.Node, fetch: Callable[[str], bytes | None], scale: float) -> list[np.ndarray]:
    """Every ``<img src>`` of ``document`` decoded at its displayed size; ``fetch(src)`` returns the bytes or
    None when the image cannot be loaded."""
    decoded = []
    for node in document.elements():
        if node.tag != "img" or not node.attrs.get("src"):
            continue
        data = fetch(node.attrs["src"])
        if not data:
            continue
        try:
            with Image.open(io.BytesIO(data)) as image:
                shown = image.convert("RGBA").resize(_size(node, image.size, scale), Image.Resampling.BILINEAR)
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            continue
        decoded.append(np.asarray(shown).copy())  # owns its pixels
    return decoded
