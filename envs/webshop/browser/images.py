"""Decoded images: what a browser holds for every ``<img>`` of a page it shows.

Owns: fetching a page's images, decoding them (Pillow) and scaling them to their displayed size in device pixels
(``width``/``height`` attributes times the device scale factor), as RGBA arrays kept with the page in the
back/forward cache. A real browser's decoded-image memory is per page and per device pixel; this is the part of a
browsing workspace's private memory that differs between two samples looking at different products.

Bounded on any page (its images are the agent's to choose): at most ``MAX_IMAGES`` images are fetched per page,
each at most ``MAX_IMAGE_BYTES`` (the fetch stops reading past it) and ``MAX_PAGE_IMAGE_BYTES`` in all; an image
whose header declares more than ``MAX_IMAGE_PIXELS`` is refused before it is decoded (Pillow reads the header
lazily in ``Image.open``; its decompression-bomb warning is an error here, never a stall or an escape), as is one
that would take the page past ``MAX_PAGE_DECODED_PIXELS`` decoded or ``MAX_PAGE_SHOWN_PIXELS`` kept; only the
formats browsers show are opened (``FORMATS``). The displayed size is at most ``MAX_SIDE`` per side.
Must never: fail a page because an image is broken, missing or over a bound: the image is skipped, as a browser
shows a placeholder.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

import numpy as np
from PIL import Image, UnidentifiedImageError

from . import dom

MAX_SIDE = 4096  # device pixels: a hostile width/height attribute cannot make us allocate gigabytes
# <img>s loaded per page; the rest are placeholders. A shop listing shows a few dozen (the shop's: at most 12+4).
MAX_IMAGES = 100
# Bytes fetched per image: a product photo is well under a megabyte (the shop's are ~0.5 KB).
MAX_IMAGE_BYTES = 4 << 20
MAX_PAGE_IMAGE_BYTES = 32 << 20  # bytes fetched for all of a page's images
# Pixels an image's header may declare (its natural size): a 4096 x 4096 photo. Decoding costs time and memory
# in proportion (a 12000 x 12000 PNG would take ~720 MB and seconds to decode only to be shown at 1 x 1).
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_PAGE_DECODED_PIXELS = 4 * MAX_IMAGE_PIXELS  # natural pixels decoded for all of a page's images
# Displayed device pixels kept per page (RGBA, 4 bytes each: 64 MiB). The shop's product page keeps 2.7 M.
MAX_PAGE_SHOWN_PIXELS = 16 << 20
FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")

Fetch = Callable[[str, int], "bytes | None"]


def _size(node: dom.Node, natural: tuple[int, int], scale: float) -> tuple[int, int]:
    def attr(name: str, default: int) -> int:
        try:
            return max(1, int(node.attrs.get(name) or default))
        except ValueError:
            return default
    width, height = attr("width", natural[0]), attr("height", natural[1])
    return min(MAX_SIDE, max(1, round(width * scale))), min(MAX_SIDE, max(1, round(height * scale)))


class _PageBudget:
    """What a page's images may still take."""

    def __init__(self) -> None:
        self.images, self.bytes = MAX_IMAGES, MAX_PAGE_IMAGE_BYTES
        self.decoded, self.shown = MAX_PAGE_DECODED_PIXELS, MAX_PAGE_SHOWN_PIXELS


def _decode(data: bytes, node: dom.Node, scale: float, budget: _PageBudget) -> np.ndarray | None:
    """The image scaled to its displayed size, or None: broken, or over a bound (checked on the header, before
    anything is decoded)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data), formats=FORMATS) as image:
                natural = image.size[0] * image.size[1]
                shown_size = _size(node, image.size, scale)
                shown = shown_size[0] * shown_size[1]
                if natural > MAX_IMAGE_PIXELS or natural > budget.decoded or shown > budget.shown:
                    return None
                budget.decoded -= natural
                budget.shown -= shown
                scaled = image.convert("RGBA").resize(shown_size, Image.Resampling.BILINEAR)
        except (UnidentifiedImageError, OSError, ValueError, EOFError, SyntaxError, Image.DecompressionBombError,
                Image.DecompressionBombWarning):
            return None
    return np.asarray(scaled).copy()  # owns its pixels


def decode_images(document: dom.Node, fetch: Fetch, scale: float) -> list[np.ndarray]:
    """Every ``<img src>`` of ``document`` decoded at its displayed size, within the page's bounds (see the module
    docstring); ``fetch(src, max_bytes)`` returns the bytes, or None when the image cannot be loaded or is longer
    than ``max_bytes``."""
    decoded = []
    budget = _PageBudget()
    for node in document.elements():
        if node.tag != "img" or not node.attrs.get("src"):
            continue
        if budget.images <= 0 or budget.bytes <= 0:
            break
        budget.images -= 1
        data = fetch(node.attrs["src"], min(MAX_IMAGE_BYTES, budget.bytes))
        if not data:
            continue
        budget.bytes -= len(data)
        pixels = _decode(data, node, scale, budget)
        if pixels is not None:
            decoded.append(pixels)
    return decoded
