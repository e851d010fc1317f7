"""A workspace application that holds a given amount of live heap state: the fork benchmark's workload.

Owns: a heap (huge pages, or 4 KiB pages with ``huge_pages=False``) filled with distinct bytes per page (so neither the zero page nor KSM can fake sharing),
tools that read, write and digest it, and a key-value store of Python objects for small state.
Must never: touch pages it was not asked to (the benchmark measures exactly what a write costs).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np

from ..app import AppContext, HugeHeap, Tool, ToolError, WorkspaceApp
from ..records import Observation

PAGE = 4096


def fill_distinct(heap: HugeHeap) -> None:
    """Write every 4 KiB page of ``heap``: page p holds p+1 in every word (distinct per page, cheap to write, never
    the zero page)."""
    npages = heap.size // PAGE
    words = np.frombuffer(heap.map, dtype=np.uint64, count=npages * (PAGE // 8)).reshape(npages, -1)
    words[:] = np.arange(1, npages + 1, dtype=np.uint64)[:, None]


class HeapApp(WorkspaceApp):
    def __init__(self, size_bytes: int = 64 << 20, huge_pages: bool = True):
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        self.size = size_bytes
        self.huge_pages = huge_pages
        self.values: dict[str, Any] = {}
        self.heap: HugeHeap | None = None

    def setup(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.heap = HugeHeap(self.size, self.huge_pages)
        fill_distinct(self.heap)

    def _heap(self) -> HugeHeap:
        if self.heap is None:
            raise ToolError("the heap is not set up")
        return self.heap

    def tools(self) -> dict[str, Tool]:
        return {"set": self._set, "get": self._get, "write_pages": self._write_pages, "digest": self._digest,
                "random": self._random, "read_page": self._read_page}

    def _set(self, args: dict[str, Any]) -> Observation:
        self.values[str(args["key"])] = args.get("value")
        return Observation(output="ok")

    def _get(self, args: dict[str, Any]) -> Observation:
        return Observation(output=repr(self.values.get(str(args["key"]))))

    def _write_pages(self, args: dict[str, Any]) -> Observation:
        """Write one byte into ``fraction`` of the heap's 4 KiB pages (spread evenly), or into ``page``."""
        npages = self.size // PAGE
        if "page" in args:
            targets = [int(args["page"])]
        else:
            fraction = float(args.get("fraction", 0.01))
            if not 0 <= fraction <= 1:
                raise ToolError(f"fraction must be in [0, 1], got {fraction}")
            count = int(npages * fraction)
            targets = np.linspace(0, npages - 1, count, dtype=np.int64).tolist() if count else []
        value = int(args.get("value", 0xAB)) & 0xFF
        view = np.frombuffer(self._heap().map, dtype=np.uint8)
        for p in targets:
            if not 0 <= p < npages:
                raise ToolError(f"page {p} out of range (0..{npages - 1})")
        idx = np.asarray(targets, dtype=np.int64) * PAGE
        view[idx] = value
        return Observation(output=f"wrote {len(targets)} pages", data={"pages": len(targets)})

    def _read_page(self, args: dict[str, Any]) -> Observation:
        p = int(args["page"])
        return Observation(output=str(self._heap().map[p * PAGE]), data={"byte": self._heap().map[p * PAGE]})

    def _digest(self, args: dict[str, Any]) -> Observation:
        return Observation(output=hashlib.blake2b(self._heap().map, digest_size=16).hexdigest())

    def _random(self, args: dict[str, Any]) -> Observation:
        n = int(args.get("n", 4))
        return Observation(output=" ".join(str(random.getrandbits(32)) for _ in range(n)),
                           data={"ctx": [self.ctx.rng.getrandbits(32) for _ in range(n)]})

    def checkpoint(self) -> list[Any]:
        import msgspec


        return [msgspec.msgpack.encode(self.values), self._heap().map]

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        import msgspec

        self.ctx = ctx
        self.heap = HugeHeap(self.size, self.huge_pages)
        head = len(data) - self.size
        self.values = msgspec.msgpack.decode(data[:head])
        self._heap().map[:] = data[head:]

    def close(self) -> None:
        if self.heap is not None:
            self.heap.close()
