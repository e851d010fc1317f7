"""The prefix cache's errors: one tree, rooted at ``PrefixError`` (a kind of the engine's ``EngineError``).

Owns: ``PrefixError`` and its kinds: misuse of the tree (``TreeMisuse``), a replay that answered differently
(``NonDeterministicTool``), a tree file that cannot be read back (``CorruptTreeFile``), and the checkpoint store's
errors (``StoreError`` and its kinds, raised by ``store.py``, ``layer_delta.py``, ``writers.py``, ``persist.py``).
Must never: lose the file, node or call a message is about, or import anything of the prefix cache above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bunshin.envs.records import ToolCall, canonical

from ..errors import EngineError


class PrefixError(EngineError):
    """The root of every error ``bunshin.engine.prefix`` raises on purpose."""


class TreeMisuse(PrefixError):
    """Misuse of the prefix tree (a node of another tree, a delta without its base, a release too many, a negative
    size, a restored call already there); the message names the node."""


class NonDeterministicTool(PrefixError):
    """Replaying a cached call gave another observation than the one recorded: the call's effect is not
    deterministic. Its node is marked non-cacheable; the rollout that needed the replay fails with this."""

    def __init__(self, call: ToolCall, depth: int):
        self.call, self.depth = call, depth
        super().__init__(f"replaying {canonical(call).decode()} (step {depth}) answered differently than when it "
                         f"was cached: the tool is not deterministic; its prefix-tree node no longer serves")


class CorruptTreeFile(PrefixError):
    """A tree file (``persist.py``) that is torn, of another format, or does not describe a valid tree.
    ``load_tree`` turns it into an empty tree and a reason naming the file; it never escapes."""


class StoreError(PrefixError):
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
    """The store holds no checkpoint of that node id."""

    def __str__(self) -> str:
        return f"no checkpoint of node {self.args[0]!r}"
