"""Page-level comparison of two workspaces' memory: how much is identical by content, how much physically shared.

Owns: walking a process's private writable and anonymous mappings, reading which physical page backs each resident
4 KiB page (``/proc/PID/pagemap``, root only) and what it holds (``/proc/PID/mem``), and comparing two sets of
processes. It is the measurement behind "over half of an environment's memory stays identical to another sample's"
(identical by content: what a content-deduplicating system could share) versus what our forks actually share
(the same physical page).
Must never: modify the processes it reads (it only reads /proc), or run on the event loop (it reads a lot).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections import Counter
from dataclasses import dataclass

PAGE = 4096
_PRESENT = 1 << 63
_PFN_MASK = (1 << 55) - 1


@dataclass(frozen=True)
class PageSet:
    """Resident pages of some processes: content hash and physical frame of each (frames may repeat)."""

    hashes: Counter[bytes]
    frames: Counter[int]
    pages: int

    @property
    def bytes(self) -> int:
        return self.pages * PAGE


def _regions(pid: int) -> list[tuple[int, int]]:
    """Writable private mappings (heap, stacks, anonymous memory, data segments): where a workspace's state is."""
    regions = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            perms = fields[1]
            path = fields[5] if len(fields) > 5 else ""
            if perms[0] == "r" and perms[1] == "w" and perms[3] == "p" and path not in ("[vvar]", "[vsyscall]"):
                regions.append((start, end))
    return regions


def page_set(pids: list[int]) -> PageSet:
    hashes: Counter[bytes] = Counter()
    frames: Counter[int] = Counter()
    count = 0
    for pid in pids:
        try:
            regions = _regions(pid)
            pagemap = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
            mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError):
            continue
        try:
            for start, end in regions:
                n = (end - start) // PAGE
                raw = os.pread(pagemap, n * 8, (start // PAGE) * 8)
                entries = struct.unpack(f"<{len(raw) // 8}Q", raw)
                for i, entry in enumerate(entries):
                    if not entry & _PRESENT:
                        continue
                    try:
                        content = os.pread(mem, PAGE, start + i * PAGE)
                    except OSError:
                        continue
                    hashes[hashlib.blake2b(content, digest_size=12).digest()] += 1
                    frames[entry & _PFN_MASK] += 1
                    count += 1
        finally:
            os.close(pagemap)
            os.close(mem)
    return PageSet(hashes=hashes, frames=frames, pages=count)


@dataclass(frozen=True)
class Sharing:
    """Of ``a``'s resident pages: the fraction whose content also occurs in ``b`` and the fraction whose physical
    page ``b`` maps too (each page of ``b`` matched at most once)."""

    identical_fraction: float
    physically_shared_fraction: float
    a_bytes: int
    b_bytes: int


def compare(a: PageSet, b: PageSet) -> Sharing:
    if a.pages == 0:
        return Sharing(0.0, 0.0, 0, b.bytes)
    identical = sum(min(n, b.hashes.get(h, 0)) for h, n in a.hashes.items())
    shared = sum(min(n, b.frames.get(f, 0)) for f, n in a.frames.items())
    return Sharing(identical / a.pages, shared / a.pages, a.bytes, b.bytes)
