"""The tool-prefix tree as a pure data structure: which workspace states exist, who stands on them, where a state
is rebuilt from, what to evict.

The records (``Namespace``, ``Node`` and its entries) are ``node.py``'s. Samples pin the node they stand on or fork
from; budget eviction never touches a pinned entry. A pin protects only its node's entries: a snapshot is a
standalone frozen fork, so an unpinned ancestor's snapshot may go while a descendant is in use; a checkpoint stored
as a delta on its parent's keeps that parent's checkpoint (and, transitively, its chain) from eviction. Explicit
drops (``drop_hot``, ``drop_cold``: a broken snapshot, a corrupt checkpoint) are the engine's and ignore pins.

Owns: nodes, their entries and pins, the per-(node, call) issue counts behind admission, the byte accounting
against both budgets, the rebuild rule (``plan_rebuild``: a ``RebuildPlan`` the cache executes), applying the
eviction rule (``eviction.plan``; ``evict`` removes the entries at once and hands them back: the engine closes the
snapshots and deletes the checkpoints afterwards), statistics, and ``check``, the invariants.
Must never: touch a workspace or the disk, read a clock (it is injected), await, share a node between namespaces,
or remove a node record (an entry goes; the node, its call and observation stay, so replay can rebuild it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import msgspec

from bunshin.envs.records import ToolCall, canonical

from .errors import TreeMisuse
from .eviction import LRU, EvictionStrategy, cold_evictable, plan
from .node import ColdEntry, HotEntry, Kind, Namespace, Node, State

ISSUERS_KEPT = 16  # distinct issuers remembered per (node, call) that was not admitted: bounds the memory


class Admission:
    """Which executed calls become nodes: a call issued from the same node by ``min_issuers`` distinct issuers
    (an issuer is whatever the engine passes: (epoch, group, sample) makes "another sample or an earlier epoch").
    Never below a non-cacheable node, never a call declared non-cacheable."""

    def __init__(self, min_issuers: int = 2):
        if not 1 <= min_issuers <= ISSUERS_KEPT:
            raise ValueError(f"min_issuers must be within 1..{ISSUERS_KEPT}, got {min_issuers}")
        self.min_issuers = min_issuers

    def admit(self, parent: Node, call: ToolCall, issuers: int) -> bool:
        return issuers >= self.min_issuers


class Pin:
    """A sample's reference to a node. ``release()`` is idempotent; ``move(node)`` pins the next node before it lets
    go of this one (a walk down the tree). Usable as a context manager."""

    def __init__(self, tree: PrefixTree, node: Node):
        self._tree, self.node, self.released = tree, node, False

    def move(self, node: Node) -> None:
        if self.released:
            raise TreeMisuse("move() on a released pin")
        self._tree._pin(node)
        self._tree._unpin(self.node)
        self.node = node

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._tree._unpin(self.node)

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class ForkHot:
    """Fork ``node``'s snapshot."""

    node: Node


@dataclass(frozen=True, slots=True)
class RestoreCold:
    """Restore ``node``'s checkpoint."""

    node: Node


@dataclass(frozen=True, slots=True)
class SetUp:
    """Set the task up afresh: the state of ``node``, its namespace's root."""

    node: Node


@dataclass(frozen=True, slots=True)
class RebuildPlan:
    """How to bring a workspace into a node's state: ``start`` (whose ``node`` is the target or an ancestor of it),
    then ``replay``: the nodes strictly below the start's node down to the target, in order, each call executed and
    its answer checked against the node's observation."""

    start: ForkHot | RestoreCold | SetUp
    replay: tuple[Node, ...]


@dataclass(frozen=True)
class Evictions:
    """Entries given up: the engine closes each hot handle and deletes each checkpoint."""

    hot: list[tuple[Node, HotEntry]] = field(default_factory=list)
    cold: list[tuple[Node, ColdEntry]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.hot or self.cold)


@dataclass(frozen=True)
class PrefixStats:
    hits: int
    misses: int
    hit_rate: float
    tool_s_skipped: float
    admitted: int
    refused: int
    nodes: int
    nodes_hot: int
    nodes_cold: int
    nodes_absent: int
    bytes_hot: int
    bytes_cold: int
    pinned: int
    evicted_hot: int
    evicted_cold: int


class PrefixTree:
    """See the module docstring. ``hot_budget`` / ``cold_budget``: bytes, None for unbounded."""

    def __init__(self, *, hot_budget: int | None = None, cold_budget: int | None = None,
                 clock: Callable[[], float], strategy: EvictionStrategy | None = None,
                 admission: Admission | None = None):
        self.hot_budget, self.cold_budget, self.clock = hot_budget, cold_budget, clock
        self.strategy = strategy if strategy is not None else LRU()
        self.admission = admission if admission is not None else Admission()
        self.roots: dict[Namespace, Node] = {}
        self.nodes: dict[int, Node] = {}
        self.by_digest: dict[str, Node] = {}  # the store names checkpoints by digest (``CorruptEntry.dropped``)
        self.bytes_hot = self.bytes_cold = 0
        self.inflation = {Kind.HOT: 0.0, Kind.COLD: 0.0}
        self._next_id = 0
        self._counts = dict.fromkeys(("hits", "misses", "admitted", "refused", "evicted_hot", "evicted_cold"), 0)
        self._skipped_s = 0.0

    # -- structure ----------------------------------------------------------------------------------------------
    def _new(self, ns: Namespace, call: ToolCall | None, observation: object, parent: Node | None,
             tool_s: float) -> Node:
        key = canonical(call) if call is not None else b""
        seed = parent.digest.encode() + b"\0" + key if parent is not None else b"root\0" + msgspec.json.encode(ns)
        node = Node(id=self._next_id, ns=ns, call=call, key=key, observation=observation, parent=parent,
                    tool_s=tool_s, last_used=self.clock(), inflation=dict(self.inflation),
                    digest=hashlib.sha256(seed).hexdigest()[:32])
        self._next_id += 1
        self.nodes[node.id] = self.by_digest[node.digest] = node
        return node

    def _own(self, node: Node) -> Node:
        if self.nodes.get(node.id) is not node:
            raise TreeMisuse(f"{node!r} is not a node of this tree")
        return node

    def root(self, ns: Namespace, observation: object = None) -> Node:
        """The root of ``ns`` (created on first use; ``observation``: the task's first observation)."""
        if ns not in self.roots:
            self.roots[ns] = self._new(ns, None, observation, None, 0.0)
        return self.roots[ns]

    def child(self, node: Node, call: ToolCall) -> Node | None:
        """The child of ``node`` for ``call``, if it can serve (not below a non-cacheable call). No statistics."""
        found = self._own(node).children.get(canonical(call))
        return None if found is None or found.dead else found

    def lookup(self, ns: Namespace, calls: Sequence[ToolCall]) -> Node | None:
        """The deepest node matching a prefix of ``calls`` (the root when none matches; None without a root)."""
        node = self.roots.get(ns)
        if node is None or node.dead:
            return None
        for call in calls:
            found = self.child(node, call)
            if found is None:
                break
            node = found
        return node

    def walk(self, node: Node, call: ToolCall) -> Node | None:
        """One step of a sample's walk: the child serving ``call`` (a hit: its observation is the answer and its
        tool-seconds are skipped), or None (a miss: fork ``node``'s state and execute the call)."""
        found = self.child(node, call)
        if found is None:
            self._counts["misses"] += 1
            return None
        self._counts["hits"] += 1
        self._skipped_s += found.tool_s
        found.hits += 1
        self.touch(found)
        return found

    def touch(self, node: Node) -> None:
        """``node`` was used (hit, pinned, its state forked): it is the most recent for eviction."""
        node.last_used = self.clock()
        node.inflation = dict(self.inflation)

    def add(self, parent: Node, call: ToolCall, observation: object, tool_s: float, *,
            issuer: Hashable | None = None, non_cacheable: bool = False) -> Node | None:
        """``call`` was executed from ``parent``'s state and answered ``observation`` in ``tool_s``. Returns its node
        if it is (or already was) one the sample may stand on, None otherwise (admission refused it; the issue is
        counted either way). ``non_cacheable`` (declared by the suite) records a node that serves nothing, so the
        call is never admitted again and nothing below it is cached."""
        key = canonical(call)
        if self._own(parent).dead:
            self._counts["refused"] += 1
            return None
        if key in parent.children:  # another sample added it meanwhile (the engine compares observations)
            found = parent.children[key]
            return None if found.non_cacheable else found
        if non_cacheable:  # remembered as a node so that it is never counted or admitted again
            parent.issues.pop(key, None)
            parent.children[key] = self._new(parent.ns, call, observation, parent, tool_s)
            parent.children[key].non_cacheable = True
            return None
        issuers = parent.issues.setdefault(key, set())
        if len(issuers) < ISSUERS_KEPT:
            issuers.add(issuer if issuer is not None else object())
        if not self.admission.admit(parent, call, len(issuers)):
            self._counts["refused"] += 1
            return None
        del parent.issues[key]
        node = parent.children[key] = self._new(parent.ns, call, observation, parent, tool_s)
        self._counts["admitted"] += 1
        return node

    def restore(self, parent: Node, call: ToolCall, observation: object, tool_s: float) -> Node:
        """A node as a saved tree had it (``persist.py``): no admission, nothing counted; a call already under
        ``parent`` is refused (``TreeMisuse``)."""
        key = canonical(call)
        if key in self._own(parent).children:
            raise TreeMisuse(f"{key.decode()} is already a child of {parent!r}")
        parent.issues.pop(key, None)
        node = parent.children[key] = self._new(parent.ns, call, observation, parent, tool_s)
        return node

    def mark_non_cacheable(self, node: Node) -> None:
        """``node``'s call is not deterministic (replay answered differently): it and its subtree serve nothing
        from now on; their unpinned entries go at the next ``evict()``, pinned ones once released."""
        self._own(node).non_cacheable = True

    # -- pins and entries ---------------------------------------------------------------------------------------
    def pin(self, node: Node) -> Pin:
        self._pin(node)
        return Pin(self, node)

    def _pin(self, node: Node) -> None:
        self._own(node).pins += 1
        self.touch(node)

    def _unpin(self, node: Node) -> None:
        if node.pins <= 0:
            raise TreeMisuse(f"{node!r} released more often than pinned")
        node.pins -= 1

    def set_hot(self, node: Node, handle: object, nbytes: int) -> HotEntry | None:
        """``node``'s state is now the snapshot ``handle``; returns the entry it replaces (the engine closes it)."""
        old = self.drop_hot(node)
        node.hot = HotEntry(handle, _size(nbytes))
        self.bytes_hot += node.hot.nbytes
        self.touch(node)
        return old

    def set_cold(self, node: Node, checkpoint_id: str, nbytes: int, *, delta: bool = False) -> list[ColdEntry]:
        """``node``'s state is now on disk as ``checkpoint_id``; returns what it replaces (with the deltas that
        were built on the replaced checkpoint: the engine deletes them)."""
        if delta and (node.parent is None or node.parent.cold is None):
            raise TreeMisuse(f"a delta checkpoint for {node!r} needs its parent's checkpoint")
        old = [entry for _, entry in self.drop_cold(node)]
        node.cold = ColdEntry(checkpoint_id, _size(nbytes), delta)
        node.inflation[Kind.COLD] = self.inflation[Kind.COLD]
        self.bytes_cold += node.cold.nbytes
        return old

    def resize_hot(self, node: Node, nbytes: int) -> None:
        """``node``'s snapshot now holds ``nbytes`` (its share of memory changes as the workspaces around it
        diverge); the engine measures, ``evict()`` then applies the budget."""
        entry = self._own(node).hot
        if entry is not None:
            node.hot = HotEntry(entry.handle, _size(nbytes))
            self.bytes_hot += node.hot.nbytes - entry.nbytes

    def drop_hot(self, node: Node) -> HotEntry | None:
        """Remove ``node``'s hot entry now, pinned or not (a broken snapshot); returns it for the engine to close."""
        entry, self._own(node).hot = node.hot, None
        if entry is not None:
            self.bytes_hot -= entry.nbytes
        return entry

    def drop_cold(self, node: Node) -> list[tuple[Node, ColdEntry]]:
        """Remove ``node``'s cold entry now (a corrupt checkpoint), and every delta below it that built on it."""
        dropped: list[tuple[Node, ColdEntry]] = []
        stack = [self._own(node)] if node.cold is not None else []
        while stack:
            n = stack.pop()
            dropped.append((n, n.cold))  # type: ignore[arg-type]
            self.bytes_cold -= n.cold.nbytes  # type: ignore[union-attr]
            n.cold = None
            stack.extend(c for c in n.children.values() if c.cold is not None and c.cold.delta)
        return dropped

    # -- rebuilding a state -------------------------------------------------------------------------------------
    def plan_rebuild(self, node: Node, *, restore_s: float | None) -> RebuildPlan:
        """Where ``node``'s state comes from, in order of preference: the nearest snapshot on its path, itself
        included (a fork shares the snapshot's memory); else the nearest checkpoint on it whose restore pays (a
        restore is a private copy of the whole state, so it comes second even when it is nearer); else the task
        set up afresh at the root. Then the nodes below the start, down to ``node``, are replayed.
        ``restore_s``: what a restore takes (measured), None when this run cannot restore. A restore pays when it
        and the calls below the checkpoint take less than every call on the path (a set-up forks the application's
        root, sharing its memory, then replays them all). A start that fails (a broken snapshot, a corrupt
        checkpoint) loses its entry: the cache plans again."""
        path = list(self._own(node).ancestors())  # node, its parent, ... the root

        def below(i: int) -> tuple[Node, ...]:
            return tuple(reversed(path[:i]))

        for i, source in enumerate(path):
            if source.hot is not None:
                return RebuildPlan(ForkHot(source), below(i))
        if restore_s is not None:
            whole = sum(n.tool_s for n in path)
            for i, source in enumerate(path):
                if source.cold is not None and restore_s + sum(n.tool_s for n in below(i)) < whole:
                    return RebuildPlan(RestoreCold(source), below(i))
        return RebuildPlan(SetUp(path[-1]), below(len(path) - 1))

    # -- eviction -----------------------------------------------------------------------------------------------
    def evict(self) -> Evictions:
        """Drop what the strategy chose to get back under both budgets (and every unpinned entry below a
        non-cacheable call). If only pinned entries are left the tree stays over budget until they are released;
        the engine should take no new snapshot meanwhile (``fits_hot``)."""
        chosen = plan(self.nodes, _excess(self.bytes_hot, self.hot_budget),
                      _excess(self.bytes_cold, self.cold_budget), self.strategy)
        for kind in Kind:
            self.inflation[kind] = chosen.inflation(kind, self.inflation[kind])
        out = Evictions()
        for c, _ in chosen.hot:
            node = self.nodes[c.node_id]
            out.hot.append((node, self.drop_hot(node)))  # type: ignore[arg-type]
        for c, _ in chosen.cold:  # leaves first: no drop cascades
            node = self.nodes[c.node_id]
            (dropped,) = self.drop_cold(node)
            out.cold.append(dropped)
        self._counts["evicted_hot"] += len(out.hot)
        self._counts["evicted_cold"] += len(out.cold)
        return out

    def fits_hot(self, nbytes: int) -> bool:
        """Whether a new snapshot of ``nbytes`` would stay within the hot budget once every unpinned hot entry
        could go: False means it would be evicted at once or leave the tree over budget."""
        if self.hot_budget is None:
            return True
        pinned = sum(n.hot.nbytes for n in self.nodes.values() if n.hot is not None and n.pins > 0)
        return pinned + nbytes <= self.hot_budget

    # -- reporting ----------------------------------------------------------------------------------------------
    def statistics(self) -> PrefixStats:
        states = [n.state for n in self.nodes.values()]
        served = self._counts["hits"] + self._counts["misses"]
        return PrefixStats(
            hits=self._counts["hits"], misses=self._counts["misses"],
            hit_rate=self._counts["hits"] / served if served else 0.0, tool_s_skipped=round(self._skipped_s, 6),
            admitted=self._counts["admitted"], refused=self._counts["refused"], nodes=len(states),
            nodes_hot=sum(s in (State.HOT, State.BOTH) for s in states),
            nodes_cold=sum(s in (State.COLD, State.BOTH) for s in states),
            nodes_absent=states.count(State.ABSENT), bytes_hot=self.bytes_hot, bytes_cold=self.bytes_cold,
            pinned=sum(n.pins > 0 for n in self.nodes.values()),
            evicted_hot=self._counts["evicted_hot"], evicted_cold=self._counts["evicted_cold"])

    def evictable(self) -> list[Node]:
        """Nodes holding an entry that no pin protects (budget eviction may take their entries)."""
        return [n for n in self.nodes.values() if n.state is not State.ABSENT and n.pins == 0]

    def protected(self) -> list[Node]:
        """Nodes holding an entry that a pin protects."""
        return [n for n in self.nodes.values() if n.state is not State.ABSENT and n.pins > 0]

    def check(self, *, budgets: bool = False) -> None:
        """Assert the invariants (tests call it after every step; ``budgets=True`` right after ``evict()``)."""
        seen: set[int] = set()
        for ns, root in self.roots.items():
            assert root.ns == ns and root.parent is None and root.call is None, root
            stack = [root]
            while stack:
                n = stack.pop()
                assert n.id not in seen and self.nodes.get(n.id) is n, f"{n!r} reached twice or not registered"
                seen.add(n.id)
                assert n.pins >= 0 and n.ns == ns, n
                for key, c in n.children.items():
                    assert c.call is not None and c.parent is n and c.ns == n.ns, c
                    assert c.key == key == canonical(c.call), c
                    assert key not in n.issues, "an admitted call still counted as an issue"
                    stack.append(c)
                if n.cold is not None and n.cold.delta:
                    assert n.parent is not None and n.parent.cold is not None, f"{n!r}: delta without its base"
        assert seen == set(self.nodes), "a node not reachable from its namespace's root"
        assert {n.digest: n.id for n in self.by_digest.values()} == {n.digest: n.id for n in self.nodes.values()}
        with_entry = [n for n in self.nodes.values() if n.state is not State.ABSENT]
        assert len(self.evictable()) + len(self.protected()) == len(with_entry)
        assert self.bytes_hot == sum(n.hot.nbytes for n in self.nodes.values() if n.hot is not None)
        assert self.bytes_cold == sum(n.cold.nbytes for n in self.nodes.values() if n.cold is not None)
        if budgets:  # over a budget only when nothing of that kind may go
            if _excess(self.bytes_hot, self.hot_budget) > 0:
                assert not any(n.hot is not None and n.pins == 0 for n in self.nodes.values()), "hot over budget"
            if _excess(self.bytes_cold, self.cold_budget) > 0:
                assert not any(cold_evictable(n) for n in self.nodes.values()), "cold over budget"
            assert not any(n.dead and n.pins == 0 and n.hot is not None for n in self.nodes.values())


def _size(nbytes: int) -> int:
    if nbytes < 0:
        raise TreeMisuse(f"an entry's size is >= 0 bytes, got {nbytes}")
    return nbytes


def _excess(used: int, budget: int | None) -> int:
    return 0 if budget is None else used - budget
