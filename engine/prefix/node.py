"""The prefix tree's records: a namespace, a node and its entries, the kinds of entry. Rules over them live above:
``eviction.py`` (what to give up) and ``tree.py`` (the tree, its rebuild plans).

A namespace (suite, task, configuration digest) has one root, the task's initialised workspace; a node below it
stands for the workspace after one more canonical call, and keeps that call's observation, its tool-seconds and a
hot entry (a frozen snapshot handle and its bytes), a cold entry (a checkpoint id and its bytes on disk), both, or
neither (absent: its observation still serves hits; its state is rebuilt by replay).
Owns: ``Namespace``, ``Kind``, ``State``, ``HotEntry``, ``ColdEntry``, ``Node`` and what a node can say of itself
(its path, depth, root, whether it is dead).
Must never: change a node (the tree does), or import the tree or its rules.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bunshin.envs.records import ToolCall


class Namespace(msgspec.Struct, frozen=True, kw_only=True):
    """What must be equal for two workspaces to share prefixes. ``config``: a digest of the workspace configuration
    and code version (``Namespace.digest``); a changed suite or code starts a new namespace."""

    suite: str
    task_id: str
    config: str

    @staticmethod
    def digest(*parts: Any) -> str:
        return hashlib.sha256(msgspec.json.encode(parts, order="sorted")).hexdigest()[:16]


class Kind(enum.Enum):
    HOT = "hot"  # a frozen snapshot in memory, under the hot (memory) budget
    COLD = "cold"  # a checkpoint on disk, under the cold (disk) budget


class State(enum.Enum):
    ABSENT = "absent"
    HOT = "hot"
    COLD = "cold"
    BOTH = "hot+cold"


@dataclass(frozen=True, slots=True)
class HotEntry:
    handle: object  # the engine's snapshot (a frozen ``Snapshot``); opaque here
    nbytes: int


@dataclass(frozen=True, slots=True)
class ColdEntry:
    """``delta``: stored relative to the parent's checkpoint, so it is readable only while the parent's cold entry
    exists; the tree never evicts a checkpoint a child's delta builds on."""

    checkpoint_id: str
    nbytes: int
    delta: bool = False


@dataclass(eq=False)
class Node:
    id: int
    ns: Namespace
    call: ToolCall | None  # None at a root
    key: bytes  # canonical(call); b"" at a root
    observation: object
    parent: Node | None
    tool_s: float = 0.0  # what the call took, what a hit on it saves
    children: dict[bytes, Node] = field(default_factory=dict)
    hot: HotEntry | None = None
    cold: ColdEntry | None = None
    pins: int = 0
    hits: int = 0
    last_used: float = 0.0
    non_cacheable: bool = False
    issues: dict[bytes, set[Hashable]] = field(default_factory=dict)  # calls issued here that are not children
    inflation: dict[Kind, float] = field(default_factory=dict)  # the tree's GreedyDual L at the last use
    digest: str = ""  # stable across runs: (namespace, canonical path); a name for its checkpoint

    @property
    def depth(self) -> int:
        return sum(1 for _ in self.ancestors()) - 1

    @property
    def state(self) -> State:
        if self.hot is not None:
            return State.BOTH if self.cold is not None else State.HOT
        return State.COLD if self.cold is not None else State.ABSENT

    def ancestors(self) -> Iterator[Node]:
        """This node, its parent, ... its root."""
        node: Node | None = self
        while node is not None:
            yield node
            node = node.parent

    @property
    def root(self) -> Node:
        """The root of this node's namespace."""
        *_, root = self.ancestors()
        return root

    @property
    def dead(self) -> bool:
        """Below (or at) a non-cacheable call: nothing serves from it, its entries go at the next eviction."""
        return any(n.non_cacheable for n in self.ancestors())

    def calls(self) -> list[ToolCall]:
        """The calls from the root to this node."""
        return [n.call for n in reversed(list(self.ancestors())) if n.call is not None]

    def __repr__(self) -> str:
        what = self.call.name if self.call is not None else "root"
        return f"<Node {self.id} {what} depth={self.depth} {self.state.value} pins={self.pins}>"
