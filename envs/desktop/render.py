"""The desktop's screen: every window keeps its own rendered RGBA texture (as a compositor does), re-rendered only
when the window changed; a screenshot composites the textures over the background and encodes a 1920x1080 PNG.

Owns: the look (top bar, taskbar with a button per window, window frames with titles, terminal text, editor text
with line numbers, spreadsheet grid with column letters and row numbers) and the textures' cache. Rendering is
deterministic: no clock, the one built-in font (``ImageFont.load_default(size=14)``).
Must never: depend on anything but the windows' state (same state, same pixels).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from .spreadsheet import col_letters, format_value

SCREEN_W, SCREEN_H = 1920, 1080
TOP_BAR = 28
TASKBAR = 40
TITLE = 30
LINE = 18
BG_TOP, BG_BOTTOM = (38, 52, 84), (92, 60, 110)
FRAME = (60, 60, 66, 255)
ACTIVE_TITLE, IDLE_TITLE = (52, 101, 164, 255), (90, 90, 98, 255)

_font: Any = None


def font() -> Any:
    global _font
    if _font is None:
        _font = ImageFont.load_default(size=14)
    return _font


@dataclass
class Window:
    """What the compositor needs of a window: an id, its title, a version that changes with its content, where it
    sits, and how to draw its content."""

    key: str
    title: str
    version: int
    x: int
    y: int
    kind: str  # terminal | editor | sheet
    content: Any


def background() -> Image.Image:
    img = Image.new("RGBA", (SCREEN_W, SCREEN_H))
    draw = ImageDraw.Draw(img)
    for y in range(SCREEN_H):
        t = y / (SCREEN_H - 1)
        draw.line([(0, y), (SCREEN_W, y)],
                  fill=tuple(int(a + (b - a) * t) for a, b in zip(BG_TOP, BG_BOTTOM, strict=True)))
    return img


class Compositor:
    def __init__(self, window_w: int = 1100, window_h: int = 700):
        self.window_w, self.window_h = window_w, window_h
        self.textures: dict[str, tuple[int, str, bool, Image.Image]] = {}
        self._background: Image.Image | None = None
        self.last_frame: Image.Image | None = None

    def texture(self, win: Window, active: bool) -> Image.Image:
        cached = self.textures.get(win.key)
        if cached and cached[0] == win.version and cached[1] == win.title and cached[2] == active:
            return cached[3]
        img = Image.new("RGBA", (self.window_w, self.window_h), (250, 250, 250, 255))
        draw = ImageDraw.Draw(img)
        draw.rectangle([0, 0, self.window_w - 1, TITLE], fill=ACTIVE_TITLE if active else IDLE_TITLE)
        draw.text((12, 7), win.title, font=font(), fill=(255, 255, 255, 255))
        for i, colour in enumerate([(237, 85, 59, 255), (246, 190, 0, 255), (60, 174, 98, 255)]):
            cx = self.window_w - 20 - i * 22
            draw.ellipse([cx - 7, 8, cx + 7, 22], fill=colour)
        draw.rectangle([0, 0, self.window_w - 1, self.window_h - 1], outline=FRAME)
        body = (0, TITLE + 1, self.window_w, self.window_h)
        {"terminal": self._terminal, "editor": self._editor, "sheet": self._sheet}[win.kind](draw, body, win.content)
        self.textures[win.key] = (win.version, win.title, active, img)
        return img

    def forget(self, key: str) -> None:
        self.textures.pop(key, None)

    def _rows(self, body: tuple[int, int, int, int]) -> int:
        return max(1, (body[3] - body[1] - 12) // LINE)

    def _terminal(self, draw: ImageDraw.ImageDraw, body: tuple[int, int, int, int], lines: list[str]) -> None:
        draw.rectangle(body, fill=(30, 30, 30, 255))
        rows = self._rows(body)
        for i, text in enumerate(lines[-rows:]):
            draw.text((body[0] + 8, body[1] + 6 + i * LINE), text[:160], font=font(), fill=(220, 220, 220, 255))

    def _editor(self, draw: ImageDraw.ImageDraw, body: tuple[int, int, int, int], buf: Any) -> None:
        rows = self._rows(body)
        draw.rectangle((body[0], body[1], body[0] + 48, body[3]), fill=(236, 236, 236, 255))
        for i, text in enumerate(buf.lines[:rows]):
            y = body[1] + 6 + i * LINE
            draw.text((body[0] + 6, y), f"{i + 1:>4}", font=font(), fill=(140, 140, 140, 255))
            draw.text((body[0] + 56, y), text[:150], font=font(), fill=(20, 20, 20, 255))

    def _sheet(self, draw: ImageDraw.ImageDraw, body: tuple[int, int, int, int], sheet: Any) -> None:
        x0, y0, x1, y1 = body
        head_w, cell_w, cell_h = 48, 110, 22
        cols = (x1 - x0 - head_w) // cell_w
        rows = (y1 - y0 - cell_h) // cell_h
        draw.rectangle((x0, y0, x1, y0 + cell_h), fill=(230, 230, 230, 255))
        draw.rectangle((x0, y0, x0 + head_w, y1), fill=(230, 230, 230, 255))
        for c in range(cols):
            x = x0 + head_w + c * cell_w
            draw.line([(x, y0), (x, y1)], fill=(200, 200, 200, 255))
            draw.text((x + cell_w // 2 - 6, y0 + 3), col_letters(c), font=font(), fill=(60, 60, 60, 255))
        for r in range(rows):
            y = y0 + cell_h + r * cell_h
            draw.line([(x0, y), (x1, y)], fill=(200, 200, 200, 255))
            draw.text((x0 + 6, y + 3), str(r + 1), font=font(), fill=(60, 60, 60, 255))
            for c in range(cols):
                if (r, c) in sheet.inputs:
                    text = format_value(sheet.value_at(r, c))[:13]
                    draw.text((x0 + head_w + c * cell_w + 4, y + 3), text, font=font(), fill=(20, 20, 20, 255))

    def screenshot(self, windows: list[Window], active: str | None, png_level: int = 1) -> bytes:
        """Composite ``windows`` (bottom to top) into a 1920x1080 PNG (``last_frame`` keeps the RGB image)."""
        if self._background is None:
            self._background = background()
        frame = self._background.copy()
        draw = ImageDraw.Draw(frame)
        draw.rectangle([0, 0, SCREEN_W, TOP_BAR], fill=(20, 20, 24, 255))
        draw.text((12, 6), "Activities", font=font(), fill=(255, 255, 255, 255))
        for win in windows:
            frame.paste(self.texture(win, win.key == active), (win.x, win.y))
        draw.rectangle([0, SCREEN_H - TASKBAR, SCREEN_W, SCREEN_H], fill=(20, 20, 24, 255))
        for i, win in enumerate(windows):
            x = 8 + i * 228
            draw.rectangle([x, SCREEN_H - TASKBAR + 6, x + 220, SCREEN_H - 6],
                           fill=ACTIVE_TITLE if win.key == active else IDLE_TITLE)
            draw.text((x + 8, SCREEN_H - TASKBAR + 12), win.title[:26], font=font(), fill=(255, 255, 255, 255))
        rgb = frame.convert("RGB")
        self.last_frame = rgb
        out = io.BytesIO()
        rgb.save(out, format="PNG", compress_level=png_level)
        return out.getvalue()
