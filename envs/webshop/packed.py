"""Read-only records packed into one huge-page heap, decoded on access: state that forks stay sharing.

Why: reading a Python object writes its reference count, so a clone that merely *reads* a catalog of Python
objects copies every page it touches, and a search over the whole catalog would copy the whole heap. Records here
are bytes in a ``HugeHeap`` (plus an offsets array in the same heap); reading one decodes fresh objects and writes
nothing shared. Owns: packing, random access, and the memory it holds.
Must never: hand out views into the heap that outlive it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

import msgspec
import numpy as np

from ..app import HugeHeap

T = TypeVar("T")


class PackedRecords(Generic[T]):
    """``len()`` records of type ``kind``; ``self[i]`` decodes the i-th."""

    def __init__(self, kind: type[T], items: Iterable[T]):
        encoder = msgspec.msgpack.Encoder()
        blobs = [encoder.encode(item) for item in items]
        offsets = np.zeros(len(blobs) + 1, dtype=np.uint64)
        np.cumsum([len(b) for b in blobs], out=offsets[1:])
        data_size = int(offsets[-1])
        self.heap = HugeHeap(data_size + offsets.nbytes)
        self.heap.map[:data_size] = b"".join(blobs)
        self._views(kind, len(blobs), data_size)
        self._offsets[:] = offsets

    def _views(self, kind: type[T], count: int, data_size: int) -> None:
        self.kind, self._count, self._data_size = kind, count, data_size
        self._offsets = np.frombuffer(self.heap.map, dtype=np.uint64, count=count + 1, offset=data_size)
        self._data = memoryview(self.heap.map)[:data_size]
        self._decoder = msgspec.msgpack.Decoder(kind)

    def __getstate__(self) -> dict[str, Any]:
        """For a state image: the heap (its bytes out of band) and what the views over it need."""
        return {"kind": self.kind, "count": self._count, "data_size": self._data_size, "heap": self.heap}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.heap = state["heap"]
        self._views(state["kind"], state["count"], state["data_size"])

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> T:
        if not 0 <= index < self._count:
            raise IndexError(index)
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        return self._decoder.decode(self._data[start:end])

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(self._count))

    @property
    def nbytes(self) -> int:
        return self.heap.size

    def close(self) -> None:
        self._data.release()
        del self._offsets
        self.heap.close()
