"""Checkpoint files of application state: magic, format version, length, payload, CRC-32.

Owns: writing a checkpoint to a directory descriptor and mapping it back after verifying it.
Must never: hand out a payload it could not verify; the error names the file.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterable

from ..errors import EnvsError

MAGIC = b"BUNSHCKP"
VERSION = 1
_HEADER = struct.Struct("<8sIQ")  # magic, version, payload length
_TRAILER = struct.Struct("<I")  # crc32 of the payload
_CHUNK = 8 << 20


class CorruptCheckpoint(EnvsError, ValueError):
    pass


def create(dir_fd: int, path: str) -> int:
    """A new (truncated) checkpoint file under ``dir_fd``, open for writing."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)


def write(dir_fd: int, path: str, parts: Iterable[bytes | memoryview]) -> int:
    fd = create(dir_fd, path)
    try:
        return write_fd(fd, parts)
    finally:
        os.close(fd)


def write_fd(fd: int, parts: Iterable[bytes | memoryview]) -> int:
    """Write a whole checkpoint to the open file ``fd`` (at its offset); returns the bytes written."""
    views = [memoryview(p).cast("B") for p in parts]
    length = sum(v.nbytes for v in views)
    crc = 0
    _write_all(fd, _HEADER.pack(MAGIC, VERSION, length))
    for view in views:
        for start in range(0, view.nbytes, _CHUNK):
            chunk = view[start : start + _CHUNK]
            crc = zlib.crc32(chunk, crc)
            _write_all(fd, chunk)
    _write_all(fd, _TRAILER.pack(crc))
    return _HEADER.size + length + _TRAILER.size


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def map_verified(dir_fd: int, path: str) -> tuple[mmap.mmap, memoryview]:
    """Map the checkpoint read-only and return (map, payload view); close the map when done."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return map_verified_fd(fd, path)
    finally:
        os.close(fd)


def map_verified_fd(fd: int, path: str) -> tuple[mmap.mmap, memoryview]:
    """As ``map_verified``, from an open descriptor (``path`` names the file in errors)."""
    size = os.fstat(fd).st_size
    if size < _HEADER.size + _TRAILER.size:
        raise CorruptCheckpoint(f"checkpoint {path}: {size} bytes is shorter than its header")
    mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    magic, version, length = _HEADER.unpack_from(mapping, 0)
    if magic != MAGIC:
        mapping.close()
        raise CorruptCheckpoint(f"checkpoint {path}: bad magic {magic!r}")
    if version != VERSION:
        mapping.close()
        raise CorruptCheckpoint(f"checkpoint {path}: format version {version}, this reader knows {VERSION}")
    if _HEADER.size + length + _TRAILER.size != size:
        mapping.close()
        raise CorruptCheckpoint(f"checkpoint {path}: header says {length} payload bytes, file has {size}")
    payload = memoryview(mapping)[_HEADER.size : _HEADER.size + length]
    crc = 0
    for start in range(0, length, _CHUNK):
        crc = zlib.crc32(payload[start : start + _CHUNK], crc)
    (expected,) = _TRAILER.unpack_from(mapping, _HEADER.size + length)
    if crc != expected:
        payload.release()
        mapping.close()
        raise CorruptCheckpoint(f"checkpoint {path}: checksum mismatch")
    return mapping, payload
