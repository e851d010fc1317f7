"""Pixels of a page: the full-page raster of the laid-out accessibility lines and the viewport screenshot.

Owns: drawing (Pillow, the bundled FreeType font at fixed sizes: deterministic, no timestamps): one
``LINE_HEIGHT`` row per content line of the tree, indented by depth; headings larger and bold, links blue and
underlined, buttons boxed, text boxes and comboboxes as boxes showing their value (or the greyed placeholder),
checkboxes, list bullets, image placeholders, table rules, a focus ring on the focused element. The raster is an
``H x W x 3`` uint8 numpy array (``H = max(viewport height, lines * LINE_HEIGHT + margin)``, at most
``MAX_RASTER_HEIGHT``, as a browser caps a full-page screenshot): the browser keeps one per history entry, as a
real browser keeps decoded page state in its back/forward cache, so it costs ``H * W * 3`` bytes per page (a
60-line page at 1280 px wide: 3.7 MB; the cap: 63 MB). The viewport screenshot is PNG bytes of exactly the
viewport size, cropped from the raster at the scroll position and padded with white below a short page, or, below
the raster's cap, drawn from the tree's lines at the scroll position (``render_lines``): the same pixels.
Bounded: at most ``MAX_RASTER_HEIGHT // LINE_HEIGHT`` lines are drawn per raster; names are at most
``accessibility.MAX_NAME_CHARS`` long and fitted to their room by bisection (a few measurements per line).
Must never: depend on wall-clock time, system fonts or anything but the tree, the focus and the sizes.
"""

from __future__ import annotations

import functools
import io

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .accessibility import LINE_HEIGHT, Line, Tree

MARGIN_X = 16
INDENT = 20
BOTTOM_MARGIN = 20
TEXT = (33, 33, 33)
LINK = (0, 107, 180)
MUTED = (140, 140, 140)
BORDER = (173, 173, 173)
PRICE = (181, 40, 40)
FOCUS = (30, 120, 255)
# The tallest full-page raster (px): Chromium's full-page captures stop at 16384 px (its largest texture). The
# shop's tallest page is under 3,000 px; past the cap the viewport is drawn from the lines when shown.
MAX_RASTER_HEIGHT = 16384


@functools.lru_cache(maxsize=8)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def page_height(tree: Tree, viewport_height: int) -> int:
    """The full page's height in px (uncapped)."""
    return max(viewport_height, len(tree.lines) * LINE_HEIGHT + BOTTOM_MARGIN)


def raster_height(tree: Tree, viewport_height: int) -> int:
    """The height of the page's raster: the page's, capped at ``MAX_RASTER_HEIGHT`` (never below the viewport)."""
    return min(page_height(tree, viewport_height), max(MAX_RASTER_HEIGHT, viewport_height))


def _fit(text: str, f: ImageFont.FreeTypeFont | ImageFont.ImageFont, room: float) -> str:
    """``text`` cut (with an ellipsis) to fit ``room`` pixels."""
    if room <= 0:
        return ""
    length = f.getlength(text)
    if length <= room:
        return text
    keep = max(0, int(len(text) * room / length) - 2)
    if keep > 0 and f.getlength(text[:keep] + "...") > room:
        # the longest shorter prefix that fits, by bisection (widths grow with the prefix)
        low, high = 0, keep
        while high - low > 1:
            middle = (low + high) // 2
            if f.getlength(text[:middle] + "...") <= room:
                low = middle
            else:
                high = middle
        keep = low
    return text[:keep] + "..."


def _draw_line(draw: ImageDraw.ImageDraw, line: Line, y: int, width: int, focused: bool) -> None:
    x = MARGIN_X + (line.depth - 1) * INDENT
    room = width - MARGIN_X - x
    regular = font(14)
    ty = y + 3
    role, name = line.role, line.name
    box: tuple[int, int, int, int] | None = None
    if role == "heading":
        big = font(17)
        text = _fit(name, big, room)
        draw.text((x, y + 1), text, font=big, fill=TEXT)
        draw.text((x + 1, y + 1), text, font=big, fill=TEXT)  # bold by double strike
        box = (x - 2, y, x + int(big.getlength(text)) + 3, y + LINE_HEIGHT - 1)
    elif role == "link":
        text = _fit(name, regular, room)
        draw.text((x, ty), text, font=regular, fill=LINK)
        end = x + int(regular.getlength(text))
        draw.line((x, y + 17, end, y + 17), fill=LINK)
        box = (x - 2, y, end + 2, y + LINE_HEIGHT - 1)
    elif role == "button":
        text = _fit(name, regular, room - 16)
        end = x + int(regular.getlength(text)) + 16
        draw.rectangle((x, y + 1, end, y + LINE_HEIGHT - 2), fill=(238, 238, 238), outline=BORDER)
        draw.text((x + 8, ty - 1), text, font=regular, fill=TEXT)
        box = (x - 2, y, end + 2, y + LINE_HEIGHT - 1)
    elif role in ("textbox", "combobox"):
        end = min(x + 360, width - MARGIN_X)
        draw.rectangle((x, y + 1, end, y + LINE_HEIGHT - 2), fill=(255, 255, 255), outline=BORDER)
        shown, colour = (line.value, TEXT) if line.value else (line.placeholder, MUTED)
        draw.text((x + 6, ty - 1), _fit(shown.replace("\n", " "), regular, end - x - 24), font=regular, fill=colour)
        if role == "combobox":
            draw.polygon(((end - 14, y + 8), (end - 6, y + 8), (end - 10, y + 13)), fill=TEXT)
        box = (x - 2, y, end + 2, y + LINE_HEIGHT - 1)
    elif role in ("checkbox", "radio"):
        checked = ("checked", "true") in line.props
        if role == "checkbox":
            draw.rectangle((x, y + 4, x + 12, y + 16), outline=TEXT, fill=FOCUS if checked else None)
        else:
            draw.ellipse((x, y + 4, x + 12, y + 16), outline=TEXT, fill=FOCUS if checked else None)
        draw.text((x + 18, ty), _fit(name, regular, room - 18), font=regular, fill=TEXT)
        box = (x - 2, y, x + 16, y + LINE_HEIGHT - 1)
    elif role == "listitem":
        draw.ellipse((x, y + 8, x + 4, y + 12), fill=TEXT)
        if name:
            draw.text((x + 10, ty), _fit(name, regular, room - 10), font=regular, fill=TEXT)
    elif role == "img":
        draw.rectangle((x, y + 2, x + 48, y + LINE_HEIGHT - 3), fill=(225, 229, 235), outline=BORDER)
        draw.text((x + 56, ty), _fit(name, regular, room - 56), font=regular, fill=MUTED)
    elif role in ("table", "row", "separator"):
        draw.line((x, y + LINE_HEIGHT // 2, width - MARGIN_X, y + LINE_HEIGHT // 2), fill=(225, 225, 225))
    elif role == "option":
        selected = ("selected", "True") in line.props
        draw.text((x, ty), _fit(("> " if selected else "  ") + name, regular, room), font=regular,
                  fill=TEXT if selected else MUTED)
    else:  # StaticText, cells, headers and anything else: text
        price = name.startswith("$") and name[1:2].isdigit()
        bold = role in ("columnheader", "rowheader")
        text = _fit(name, regular, room)
        colour = PRICE if price else TEXT
        draw.text((x, ty), text, font=regular, fill=colour)
        if price or bold:
            draw.text((x + 1, ty), text, font=regular, fill=colour)
    if focused and box is not None:
        draw.rectangle(box, outline=FOCUS, width=2)


def render_lines(tree: Tree, first: int, width: int, height: int, focused: int | None = None) -> np.ndarray:
    """``height`` px of the page from content line ``first`` down, as an ``height x width x 3`` uint8 array: only
    the lines that show are drawn (and the one above, whose glyphs may reach into the first row)."""
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    last = min(len(tree.lines), first + -(-height // LINE_HEIGHT))
    for index in range(max(0, first - 1), last):
        line = tree.lines[index]
        _draw_line(draw, line, (index - first) * LINE_HEIGHT, width, line.node_id == focused)
    return np.array(image)  # owns its pixels (not a view of the PIL image)


def render_raster(tree: Tree, width: int, viewport_height: int, focused: int | None = None) -> np.ndarray:
    """The full page as an ``H x width x 3`` uint8 array, one ``LINE_HEIGHT`` row per content line; ``H`` is
    capped at ``MAX_RASTER_HEIGHT``."""
    return render_lines(tree, 0, width, raster_height(tree, viewport_height), focused)


def viewport_png(raster: np.ndarray, scroll_px: int, viewport: tuple[int, int]) -> bytes:
    """PNG of exactly ``viewport`` (width, height) pixels: the raster from ``scroll_px`` down, white-padded."""
    width, height = viewport
    crop = raster[scroll_px:scroll_px + height, :width]
    if crop.shape[0] < height or crop.shape[1] < width:
        padded = np.full((height, width, 3), 255, dtype=np.uint8)
        padded[:crop.shape[0], :crop.shape[1]] = crop
        crop = padded
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(crop), "RGB").save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
