"""The checkpoint store's errors (``store.py``, ``layer_delta.py``, ``writers.py``).

Owns: ``StoreError`` (a kind of ``EngineError``) and its kinds. Must never: lose the file a message is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import EngineError


class StoreError(EngineError):
    """The root of the checkpoint store's errors."""


class CorruptEntry(StoreError, ValueError):
    """A manifest or chunk failed verification (or is missing); it was dropped with every node that needed it
    (``dropped``: node ids, to rebuild by replay)."""

    def __init__(self, path: Path, reason: str, dropped: Sequence[str] = ()):
        super().__init__(f"checkpoint entry {path}: {reason}; dropped nodes {list(dropped)}")
        self.path, self.reason, self.dropped = path, reason, tuple(dropped)


class StoreFull(StoreError):
    """No space left while writing (``__cause__`` is the OSError); nothing of the write stays visible."""


class StoreWriteFailed(StoreError):
    """Another I/O error while writing; nothing of the write stays visible."""


class StoreBusy(StoreError):
    """Another process holds the store's directory."""


class UnknownNode(StoreError, KeyError):
    def __str__(self) -> str:
        return f"no checkpoint of node {self.args[0]!r}"
