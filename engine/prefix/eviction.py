"""Eviction for the prefix tree: which hot snapshots and cold checkpoints to give up to get back under a budget.

Owns: ``Candidate`` (what a strategy may look at: sizes, recency, hits, the tool-seconds an entry saves), the
``EvictionStrategy`` protocol (one method, ``key``: the lowest key goes first) with ``LRU`` and ``CostAware``
(GreedyDual-Size-Frequency), ``choose``, the heap that picks victims, and ``plan``, the eviction rule that runs:
a pure function of the nodes, the bytes to free and the strategy, returning an ``EvictionPlan`` that the tree
applies (``PrefixTree.evict``). It offers the strategy the evictable entries: unpinned hot entries; unpinned cold
entries no child's delta builds on (a base becomes a candidate once the deltas on it are chosen, so checkpoints go
leaves first); entries below a non-cacheable call are forced (they go whatever the budget).
Must never: see a pinned entry, mutate a node, or read a clock (recency comes from the tree's injected clock
through ``Candidate.last_used``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

from .node import Kind, Node

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Candidate:
    """One evictable entry. ``saved_s``: the tool-seconds a sample forking from this entry saves against replaying
    from the nearest ancestor that has an entry (the whole path from the root when none has). ``inflation``: the
    tree's GreedyDual value ``L`` for this kind when the node was last used (``LRU`` ignores it). ``forced``: the
    node is below a non-cacheable call, nothing can use it, it goes whatever the budget."""

    node_id: int
    kind: Kind
    nbytes: int
    last_used: float
    hits: int
    saved_s: float
    inflation: float = 0.0
    forced: bool = False


class EvictionStrategy(Protocol):
    """Orders candidates: the lowest ``key`` is evicted first. Ties break by node id (oldest node first)."""

    name: str

    def key(self, c: Candidate) -> float: ...


class LRU:
    """Least recently used first: the default. Recency is the tree's clock at the node's last hit, pin or use."""

    name = "lru"

    def key(self, c: Candidate) -> float:
        return c.last_used


class CostAware:
    """GreedyDual-Size-Frequency: keep what saves the most tool-seconds per byte, weighted by how often it was hit;
    ``inflation`` (the key of the last entry evicted of that kind, recorded on the node when it was last used) ages
    entries nobody used since, so a once-expensive prefix of an old policy does not stay forever."""

    name = "cost"

    def key(self, c: Candidate) -> float:
        return c.inflation + c.saved_s * (1 + c.hits) / max(c.nbytes / MiB, 1e-6)


STRATEGIES: dict[str, Callable[[], EvictionStrategy]] = {"lru": LRU, "cost": CostAware}


def choose(candidates: Iterable[Candidate], excess: int, strategy: EvictionStrategy,
           unlocked: Callable[[Candidate], Iterable[Candidate]] = lambda c: ()) -> list[tuple[Candidate, float]]:
    """Victims, lowest key first, until ``excess`` bytes are freed; forced candidates always go. ``unlocked(c)``
    yields candidates that become evictable once ``c`` is gone (a cold checkpoint that was the base of ``c``'s
    delta). Returns each victim with its key (the tree keeps the largest as GreedyDual's ``L``)."""
    heap = [(not c.forced, strategy.key(c), c.node_id, c) for c in candidates]
    heapq.heapify(heap)
    victims: list[tuple[Candidate, float]] = []
    freed = 0
    while heap and (freed < excess or not heap[0][0]):
        _, key, _, c = heapq.heappop(heap)
        victims.append((c, key))
        freed += c.nbytes
        for more in unlocked(c):
            heapq.heappush(heap, (not more.forced, strategy.key(more), more.node_id, more))
    return victims


def candidate(node: Node, kind: Kind) -> Candidate:
    """``node``'s ``kind`` entry as a candidate; ``saved_s`` counts back to the nearest ancestor with any entry."""
    saved = 0.0
    for n in node.ancestors():
        if n is not node and (n.hot is not None or n.cold is not None):
            break
        saved += n.tool_s
    entry = node.hot if kind is Kind.HOT else node.cold
    assert entry is not None, f"{node!r} has no {kind.value} entry"
    return Candidate(node_id=node.id, kind=kind, nbytes=entry.nbytes, last_used=node.last_used, hits=node.hits,
                     saved_s=saved, inflation=node.inflation.get(kind, 0.0), forced=node.dead)


def cold_evictable(node: Node, gone: AbstractSet[int] = frozenset()) -> bool:
    """Unpinned, holding a checkpoint, and no child's delta (other than those in ``gone``) builds on it."""
    return (node.cold is not None and node.pins == 0 and node.id not in gone
            and not any(c.cold is not None and c.cold.delta and c.id not in gone for c in node.children.values()))


@dataclass(frozen=True)
class EvictionPlan:
    """Victims, each with its strategy key, in the order they were chosen: ``hot`` snapshots and ``cold``
    checkpoints (leaves first: dropping them in order never cascades)."""

    hot: tuple[tuple[Candidate, float], ...]
    cold: tuple[tuple[Candidate, float], ...]

    def inflation(self, kind: Kind, current: float) -> float:
        """GreedyDual's ``L`` for ``kind`` once the plan is applied: the largest key evicted so far (forced victims
        do not count)."""
        victims = self.hot if kind is Kind.HOT else self.cold
        return max([current, *(key for c, key in victims if not c.forced)])


def plan(nodes: Mapping[int, Node], hot_excess: int, cold_excess: int, strategy: EvictionStrategy) -> EvictionPlan:
    """The hot and cold victims that free ``hot_excess`` and ``cold_excess`` bytes (all of the evictable ones when
    that is not enough), and every unpinned entry below a non-cacheable call."""
    hot = [candidate(n, Kind.HOT) for n in nodes.values() if n.hot is not None and n.pins == 0]
    gone: set[int] = set()

    def unlocked(c: Candidate) -> list[Candidate]:
        gone.add(c.node_id)
        node = nodes[c.node_id]  # only a delta held its parent back: the parent is offered when its last one goes
        parent = node.parent if node.cold is not None and node.cold.delta else None
        return [candidate(parent, Kind.COLD)] if parent is not None and cold_evictable(parent, gone) else []

    cold = [candidate(n, Kind.COLD) for n in nodes.values() if cold_evictable(n)]
    return EvictionPlan(hot=tuple(choose(hot, hot_excess, strategy)),
                        cold=tuple(choose(cold, cold_excess, strategy, unlocked)))
