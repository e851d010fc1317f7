"""Checkpoint files of application state: a frame of ``envs/framing.py`` (magic ``BUNSHCKP``, format version 1,
payload length, payload, CRC-32 of the payload).

Owns: the checkpoint format, writing a checkpoint to a directory descriptor (not atomically: a checkpoint is read
only once its writer has answered) and mapping it back after verifying it; ``CorruptCheckpoint``, the error of a
checkpoint that does not verify (its ``__cause__`` is the framing error that says how).
Must never: hand out a payload it could not verify; the error names the file.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable

from ..errors import EnvsError
from ..framing import Checksum, Format, FramingError

MAGIC = b"BUNSHCKP"
VERSION = 1
FORMAT = Format("checkpoint", MAGIC, VERSION, Checksum.CRC32)


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
    return FORMAT.write_fd(fd, parts)


def map_verified(dir_fd: int, path: str) -> tuple[mmap.mmap, memoryview]:
    """Map the checkpoint read-only and return (map, payload view); close the map when done."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return map_verified_fd(fd, path)
    finally:
        os.close(fd)


def map_verified_fd(fd: int, path: str) -> tuple[mmap.mmap, memoryview]:
    """As ``map_verified``, from an open descriptor (``path`` names the file in errors)."""
    try:
        return FORMAT.map_fd(fd, path)
    except FramingError as exc:
        raise CorruptCheckpoint(str(exc)) from exc
