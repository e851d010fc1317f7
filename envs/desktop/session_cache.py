"""The desktop session's warmed-up cache: what a session holds after login, built once in ``setup()`` and only read
afterwards, so every fork of a workspace keeps sharing it.

Owns: ``SessionCache``, one ``HugeHeap`` (anonymous memory advised to use transparent huge pages) holding the
file-search index of ``index_roots`` (paths, like locate's database), a glyph cache (ASCII glyph masks of the UI
font at 16 sizes, rendered with Pillow) and an icon cache (128x128 RGBA icons) filling the rest; ``search`` (the
``search_files`` tool's lookup).
Must never: write to the heap after it is built (a write would copy the page into the writer's private memory).
"""

from __future__ import annotations

import os

from ..app import HugeHeap

MiB = 1 << 20


def _walk_names(root: str, out: list[bytes]) -> None:
    try:
        it = os.scandir(root)
    except OSError:
        return
    with it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            out.append(os.fsencode(e.path) + b"/\n")
            _walk_names(e.path, out)
        else:
            out.append(os.fsencode(e.path) + b"\n")


def _glyphs() -> bytes:
    from PIL import ImageFont

    parts = []
    for size in range(10, 42, 2):
        f = ImageFont.load_default(size=size)
        for code in range(32, 127):
            mask = f.getmask(chr(code))
            w, h = mask.size
            parts.append(size.to_bytes(2, "little") + code.to_bytes(2, "little") + w.to_bytes(2, "little")
                         + h.to_bytes(2, "little") + bytes(mask))
    return b"".join(parts)


class SessionCache:
    """What a desktop session holds after login, packed in one huge-page heap: the file-search index, the glyph
    cache and the icon cache. Built once, then only read. The cache never shrinks below index + glyphs."""

    def __init__(self, cache_mb: float, index_roots: tuple[str, ...]):
        import numpy as np

        names: list[bytes] = []
        for root in index_roots:
            _walk_names(root, names)
        index = b"\n" + b"".join(names)
        glyphs = _glyphs()
        fixed = len(index) + len(glyphs)
        size = max(int(cache_mb * MiB), fixed + 4096)
        size = (size + 4095) // 4096 * 4096
        self.heap = HugeHeap(size)
        m = self.heap.map
        m[0:len(index)] = index
        self.index_end = len(index)
        m[self.index_end:fixed] = glyphs
        icons_start = (fixed + 4095) // 4096 * 4096
        pages = (size - icons_start) // 4096
        self.icons = pages * 4096 // (128 * 128 * 4)
        if pages:
            view = np.frombuffer(m, dtype=np.uint8, count=pages * 4096, offset=icons_start).reshape(pages, 4096)
            x = np.arange(4096, dtype=np.uint32)
            step = 4096
            for start in range(0, pages, step):  # icon pixels: gradients that differ on every page
                p = np.arange(start, min(start + step, pages), dtype=np.uint32)[:, None]
                view[start:start + len(p)] = ((x * (1 + p % 7) + p * 13 + (x >> 9) * (p % 11)) & 0xFF).astype(np.uint8)
            stamp = np.frombuffer(m, dtype=np.uint64, count=pages * 512, offset=icons_start).reshape(pages, 512)
            stamp[:, 0] = np.arange(pages, dtype=np.uint64) + 0x1C0_0000_0000
        self.size = size

    def search(self, query: str, limit: int = 50) -> list[str]:
        """Up to ``limit`` indexed paths that contain ``query``, in index order."""
        q = query.encode()
        m, found, pos = self.heap.map, [], 0
        while len(found) < limit:
            pos = m.find(q, pos, self.index_end)
            if pos < 0:
                break
            start = m.rfind(b"\n", 0, pos) + 1
            end = m.find(b"\n", pos, self.index_end)
            found.append(m[start:end].decode("utf-8", "replace"))
            pos = end + 1
        return found

    def close(self) -> None:
        self.heap.close()
