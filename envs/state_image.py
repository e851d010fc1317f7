"""An application's state as a process image, for the private-restore baseline: what a CRIU dump holds of a
process's memory, at the level of the application's objects.

Owns: ``dump(obj)`` (pickle protocol 5 with every large buffer, huge-page heaps, numpy arrays, rasters, written
out of band straight from the process's memory, so dumping copies nothing in the source) and ``load(data)`` (each
out-of-band buffer read once from the image into fresh anonymous memory, huge-page advised when large; the objects
are rebuilt around those buffers, nothing is recomputed). Image layout: magic, part count, each part's length,
then the pickle and the buffers in order.
Must never: leave an object pointing into ``data`` (a view of the image file's mapping, closed after the restore).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

from .app import HugeHeap

MAGIC = b"BUNSHIMG"
_COUNTS = struct.Struct("<8sI")  # magic, number of parts after the header
_SMALL = 64 << 10  # buffers below this are copied into a bytearray, not a heap of their own


class StateImageError(ValueError):
    """The bytes are not a state image, or not a whole one."""


def dump(obj: Any) -> list[bytes | memoryview]:
    """``obj``'s image as parts to write one after the other (the buffers are views of ``obj``'s memory: write
    them before ``obj`` changes)."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts: list[bytes | memoryview] = [body, *(b.raw() for b in buffers)]
    lengths = [memoryview(p).nbytes for p in parts]
    header = _COUNTS.pack(MAGIC, len(parts)) + struct.pack(f"<{len(parts)}Q", *lengths)
    return [header, *parts]


def load(data: bytes | memoryview) -> Any:
    """The object ``dump`` imaged, in this process's private memory."""
    view = memoryview(data).cast("B")
    try:
        magic, count = _COUNTS.unpack_from(view, 0)
    except struct.error as exc:
        raise StateImageError(f"a state image starts with a {_COUNTS.size}-byte header, got {view.nbytes} bytes") \
            from exc
    if magic != MAGIC:
        raise StateImageError(f"not a state image (magic {magic!r})")
    at = _COUNTS.size + 8 * count
    if count < 1 or at > view.nbytes:
        raise StateImageError(f"a state image of {count} parts needs a {at}-byte header, got {view.nbytes} bytes")
    lengths = struct.unpack_from(f"<{count}Q", view, _COUNTS.size)
    if at + sum(lengths) != view.nbytes:
        raise StateImageError(f"state image: parts of {sum(lengths)} bytes, payload has {view.nbytes - at}")
    parts = []
    for length in lengths:
        parts.append(view[at:at + length])
        at += length
    fresh = [_fresh_copy(p) for p in parts[1:]]
    obj = pickle.loads(parts[0], buffers=fresh)
    del fresh
    for part in parts:
        part.release()
    return obj


def _fresh_copy(part: memoryview) -> bytearray | memoryview:
    """The bytes of ``part`` in new private memory: a huge-page heap for big buffers (a ``HugeHeap`` that was
    imaged adopts it instead of copying again, see ``HugeHeap.__reduce_ex__``)."""
    if part.nbytes < _SMALL:
        return bytearray(part)
    heap = HugeHeap(part.nbytes)
    heap.map[:part.nbytes] = part
    return memoryview(heap.map)[:part.nbytes]
