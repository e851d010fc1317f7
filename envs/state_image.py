"""An application's state as a process image, for the private-restore baseline: what a CRIU dump holds of a
process's memory, at the level of the application's objects.

Owns: ``dump(obj)`` (pickle protocol 5 with every large buffer, huge-page heaps, numpy arrays, rasters, written
out of band straight from the process's memory, so dumping copies nothing in the source) and ``load(data)`` (each
out-of-band buffer read once from the image into fresh anonymous memory, huge-page advised when large; the objects
are rebuilt around those buffers, nothing is recomputed). An image is a frame of ``framing.py`` (magic
``BUNSHIMG``, format version 2, body length) whose body is the part count, each part's length, then the pickle and
the buffers in order. The frame has no checksum of its own: an image is always the payload of a checkpoint file,
whose CRC-32 the runtime verifies before ``load`` sees it (a second pass over every byte would verify nothing
more). Version 1 was the unframed layout (magic, part count, lengths, parts); such an image is refused, by its
version or its length.
Must never: leave an object pointing into ``data`` (a view of the image file's mapping, closed after the restore),
or a view of ``data`` unreleased, even when it fails.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

from .app import HugeHeap
from .errors import EnvsError
from .framing import Checksum, Format, FramingError

MAGIC = b"BUNSHIMG"
VERSION = 2
FORMAT = Format("state image", MAGIC, VERSION, Checksum.NONE)
_COUNT = struct.Struct("<I")  # the body's start: the number of parts after it
_SMALL = 64 << 10  # buffers below this are copied into a bytearray, not a heap of their own


class StateImageError(EnvsError, ValueError):
    """The bytes are not a state image, or not a whole one (the ``__cause__`` of a bad frame is its
    ``FramingError``)."""


def dump(obj: Any) -> list[bytes | memoryview]:
    """``obj``'s image as parts to write one after the other (the buffers are views of ``obj``'s memory: write
    them before ``obj`` changes)."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts: list[bytes | memoryview] = [body, *(b.raw() for b in buffers)]
    lengths = [memoryview(p).nbytes for p in parts]
    counts = _COUNT.pack(len(parts)) + struct.pack(f"<{len(parts)}Q", *lengths)
    return FORMAT.frame([counts, *parts])


def load(data: bytes | memoryview) -> Any:
    """The object ``dump`` imaged, in this process's private memory."""
    try:
        body = FORMAT.verify(data)
    except FramingError as exc:
        raise StateImageError(str(exc)) from exc
    parts: list[memoryview] = []
    try:
        (count,) = _COUNT.unpack_from(body, 0) if body.nbytes >= _COUNT.size else (0,)
        at = _COUNT.size + 8 * count
        if count < 1 or at > body.nbytes:
            raise StateImageError(f"state image: {count} parts need a {at}-byte table, the body has {body.nbytes} "
                                  "bytes")
        lengths = struct.unpack_from(f"<{count}Q", body, _COUNT.size)
        if at + sum(lengths) != body.nbytes:
            raise StateImageError(f"state image: parts of {sum(lengths)} bytes, the body has {body.nbytes - at} "
                                  "after its table")
        for length in lengths:
            parts.append(body[at:at + length])
            at += length
        fresh = [_fresh_copy(p) for p in parts[1:]]
        obj = pickle.loads(parts[0], buffers=fresh)
        del fresh
    finally:
        for part in parts:
            part.release()
        body.release()
    return obj


def _fresh_copy(part: memoryview) -> bytearray | memoryview:
    """The bytes of ``part`` in new private memory: a huge-page heap for big buffers (a ``HugeHeap`` that was
    imaged adopts it instead of copying again, see ``HugeHeap.__reduce_ex__``)."""
    if part.nbytes < _SMALL:
        return bytearray(part)
    heap = HugeHeap(part.nbytes)
    heap.map[:part.nbytes] = part
    return memoryview(heap.map)[:part.nbytes]
