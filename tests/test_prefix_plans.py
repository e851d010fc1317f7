"""The prefix tree's two rules, as pure functions of random trees: the rebuild plan (``PrefixTree.plan_rebuild``,
which the cache executes) and the eviction plan (``eviction.plan``, which ``PrefixTree.evict`` applies).

The rebuild plan is checked against its properties (its start is the target or an ancestor of it, holding the entry
it names; a fork wherever a snapshot is on the path; a restore only where it pays; the replay is exactly the nodes
between start and target) and against the rule the cache applied inline before it was a plan, transcribed below
(``inline_rule``): with random broken snapshots and corrupt checkpoints, planning again after each failed start
tries the same entries in the same order and ends at the same start. The eviction plan: never a pinned entry,
what is asked freed whenever the evictable entries hold it, nothing more than needed, everything below a
non-cacheable call, checkpoints leaves first; and ``evict()`` drops exactly what the plan chose."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.engine.prefix.eviction import LRU, CostAware, EvictionPlan, cold_evictable, plan
from bunshin.engine.prefix.node import Kind, Namespace, Node
from bunshin.engine.prefix.tree import Admission, ForkHot, PrefixTree, RebuildPlan, RestoreCold, SetUp
from bunshin.envs.records import ToolCall

NS = Namespace(suite="webshop", task_id="1", config=Namespace.digest("cfg", 1))
SETTINGS = settings(max_examples=250, deadline=None, derandomize=True, database=None)


@dataclass(frozen=True)
class Spec:
    """One node of a random tree: its parent's index (always lower), the call's tool-seconds, its entries (bytes,
    None for none), whether its checkpoint is a delta on its parent's, pins, recency, hits, non-cacheable."""

    parent: int
    tool_s: float
    hot: int | None
    cold: int | None
    delta: bool
    pins: int
    last_used: float
    hits: int
    non_cacheable: bool


@st.composite
def specs(draw: st.DrawFn, max_nodes: int = 12) -> list[Spec]:
    n = draw(st.integers(1, max_nodes))
    out = []
    for i in range(n):
        out.append(Spec(
            parent=draw(st.integers(0, i - 1)) if i else -1,
            tool_s=0.0 if i == 0 else draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0])),
            hot=draw(st.none() | st.integers(0, 40)), cold=draw(st.none() | st.integers(0, 40)),
            delta=draw(st.booleans()), pins=draw(st.sampled_from([0, 0, 0, 1])),
            last_used=draw(st.floats(0, 50)), hits=draw(st.integers(0, 3)),
            non_cacheable=i > 0 and draw(st.sampled_from([False] * 7 + [True]))))
    return out


def build(spec: list[Spec], *, strategy: object = None) -> tuple[PrefixTree, list[Node]]:
    """The tree ``spec`` describes."""
    clock = Clock()
    tree = PrefixTree(clock=clock, strategy=strategy or LRU(), admission=Admission(1))  # type: ignore[arg-type]
    nodes: list[Node] = []
    for i, s in enumerate(spec):
        if i == 0:
            node = tree.root(NS, "first")
        else:
            node = tree.restore(nodes[s.parent], ToolCall(name="call", args={"i": i}), f"obs {i}", s.tool_s)
        if s.hot is not None:
            tree.set_hot(node, f"snap{i}", s.hot)
        if s.cold is not None:
            delta = s.delta and node.parent is not None and node.parent.cold is not None
            tree.set_cold(node, f"ck{i}", s.cold, delta=delta)
        nodes.append(node)
    for node, s in zip(nodes, spec, strict=True):  # once every entry is in: pins and recency are not set_*'s
        node.pins, node.last_used, node.hits = s.pins, s.last_used, s.hits
        node.non_cacheable = s.non_cacheable
    tree.check()
    return tree, nodes


class Clock:
    def __call__(self) -> float:
        return 0.0


def entries(tree: PrefixTree) -> dict[int, tuple[object, object, int]]:
    return {n.id: (n.hot, n.cold, n.pins) for n in tree.nodes.values()}


# -- the rebuild plan ---------------------------------------------------------------------------------------------

restore_times = st.none() | st.sampled_from([-1.0, 0.0, 0.5, 2.0, 10.0])


@SETTINGS
@given(spec=specs(), data=st.data(), restore_s=restore_times)
def test_a_rebuild_plan_starts_at_an_ancestor_and_replays_exactly_the_calls_below_it(
        spec: list[Spec], data: st.DataObject, restore_s: float | None) -> None:
    tree, nodes = build(spec)
    target = data.draw(st.sampled_from(nodes))
    before = entries(tree)
    got = tree.plan_rebuild(target, restore_s=restore_s)
    assert entries(tree) == before and tree.plan_rebuild(target, restore_s=restore_s) == got  # pure
    path = list(target.ancestors())  # target ... root
    source = got.start.node
    assert source in path
    assert got.replay == tuple(reversed(path[:path.index(source)]))
    assert source.calls() + [n.call for n in got.replay] == target.calls()
    nearest_hot = next((n for n in path if n.hot is not None), None)
    whole = sum(n.tool_s for n in path)

    def pays(n: Node) -> bool:
        return restore_s is not None and restore_s + sum(m.tool_s for m in path[:path.index(n)]) < whole

    nearest_paying = next((n for n in path if n.cold is not None and pays(n)), None)
    match got.start:
        case ForkHot():  # a snapshot on the path always wins, however near a checkpoint is
            assert source is nearest_hot
        case RestoreCold():
            assert nearest_hot is None and source is nearest_paying and source.cold is not None
            assert restore_s + sum(n.tool_s for n in got.replay) < whole  # type: ignore[operator]
        case SetUp():
            assert nearest_hot is None and nearest_paying is None and source is path[-1]


def inline_rule(tree: PrefixTree, node: Node, restore_s: float | None,
                broken: set[tuple[str, int]]) -> tuple[list[tuple[str, int]], Node]:
    """``PrefixCache._rebuild`` as it was before the plan, without its awaits: the snapshots on the path nearest
    first (a broken one is dropped and the next tried), then, with a cold store, the checkpoints whose restore pays
    (a corrupt one is dropped with the deltas on it), then a set-up. Returns the entries tried and the start."""
    tried: list[tuple[str, int]] = []

    def path_between(source: Node) -> list[Node]:
        path, n = [], node
        while n is not source:
            path.append(n)
            n = n.parent  # type: ignore[assignment]
        return path[::-1]

    def restore_pays(source: Node) -> bool:
        return restore_s + sum(n.tool_s for n in path_between(source)) < sum(n.tool_s for n in node.ancestors())  # type: ignore[operator]

    for source in (n for n in node.ancestors() if n.hot is not None):
        tried.append(("hot", source.id))
        if ("hot", source.id) not in broken:
            return tried, source
        tree.drop_hot(source)
    if restore_s is not None:
        for source in (n for n in node.ancestors() if n.cold is not None and restore_pays(n)):
            tried.append(("cold", source.id))
            if ("cold", source.id) not in broken:
                return tried, source
            tree.drop_cold(source)
    tried.append(("setup", node.root.id))
    return tried, node.root


def planned(tree: PrefixTree, node: Node, restore_s: float | None,
            broken: set[tuple[str, int]]) -> tuple[list[tuple[str, int]], RebuildPlan]:
    """What the cache does now: plan, start, and plan again after a start that failed (its entry gone)."""
    tried: list[tuple[str, int]] = []
    while True:
        got = tree.plan_rebuild(node, restore_s=restore_s)
        match got.start:
            case ForkHot(node=source):
                tried.append(("hot", source.id))
                if ("hot", source.id) in broken:
                    tree.drop_hot(source)
                    continue
            case RestoreCold(node=source):
                tried.append(("cold", source.id))
                if ("cold", source.id) in broken:
                    tree.drop_cold(source)
                    continue
            case SetUp(node=source):
                tried.append(("setup", source.id))
        return tried, got


@SETTINGS
@given(spec=specs(), data=st.data(), restore_s=restore_times)
def test_planning_again_after_each_failed_start_is_the_rule_the_cache_applied_inline(
        spec: list[Spec], data: st.DataObject, restore_s: float | None) -> None:
    old_tree, old_nodes = build(spec)
    new_tree, new_nodes = build(spec)
    i = data.draw(st.integers(0, len(spec) - 1), label="target")
    broken = data.draw(st.sets(st.tuples(st.sampled_from(["hot", "cold"]), st.integers(0, len(spec) - 1))),
                       label="broken entries")
    old_broken = {(kind, old_nodes[j].id) for kind, j in broken}
    new_broken = {(kind, new_nodes[j].id) for kind, j in broken}
    old_tried, old_start = inline_rule(old_tree, old_nodes[i], restore_s, old_broken)
    new_tried, new_plan = planned(new_tree, new_nodes[i], restore_s, new_broken)
    index = {n.id: j for j, n in enumerate(old_nodes)}
    new_index = {n.id: j for j, n in enumerate(new_nodes)}
    assert [(k, index[n]) for k, n in old_tried] == [(k, new_index[n]) for k, n in new_tried]
    assert index[old_start.id] == new_index[new_plan.start.node.id]
    new_tree.check()


def test_a_broken_snapshot_falls_back_to_the_next_one_up_then_to_a_checkpoint_that_pays() -> None:
    spec = [Spec(-1, 0.0, 10, None, False, 0, 0.0, 0, False),  # the root: a snapshot
            Spec(0, 1.0, None, 10, False, 0, 0.0, 0, False),  # a checkpoint
            Spec(1, 1.0, 10, None, False, 0, 0.0, 0, False),  # a snapshot
            Spec(2, 1.0, None, None, False, 0, 0.0, 0, False)]  # the target
    tree, (root, a, b, c) = build(spec)
    assert tree.plan_rebuild(c, restore_s=0.0) == RebuildPlan(ForkHot(b), (c,))
    tree.drop_hot(b)  # its fork failed
    assert tree.plan_rebuild(c, restore_s=0.0) == RebuildPlan(ForkHot(root), (a, b, c))
    tree.drop_hot(root)
    assert tree.plan_rebuild(c, restore_s=0.5) == RebuildPlan(RestoreCold(a), (b, c))
    assert tree.plan_rebuild(c, restore_s=1.0) == RebuildPlan(SetUp(root), (a, b, c))  # 1 + 2 s is not < 3 s
    tree.drop_cold(a)  # a corrupt checkpoint
    assert tree.plan_rebuild(c, restore_s=0.0) == RebuildPlan(SetUp(root), (a, b, c))


# -- the eviction plan --------------------------------------------------------------------------------------------


def removable_cold(tree: PrefixTree) -> set[int]:
    """The checkpoints eviction could take, leaves first: unpinned, and every delta built on it removable too."""
    out: set[int] = set()

    def ok(n: Node) -> bool:
        deltas = [c for c in n.children.values() if c.cold is not None and c.cold.delta]
        return all([ok(c) for c in deltas]) and n.cold is not None and n.pins == 0

    for n in tree.nodes.values():
        if ok(n):
            out.add(n.id)
    return out


@SETTINGS
@given(spec=specs(), hot_excess=st.integers(-20, 200), cold_excess=st.integers(-20, 200),
       cost=st.booleans())
def test_an_eviction_plan_frees_what_is_asked_and_never_a_pinned_entry(
        spec: list[Spec], hot_excess: int, cold_excess: int, cost: bool) -> None:
    strategy = CostAware() if cost else LRU()
    tree, _ = build(spec, strategy=strategy)
    before = entries(tree)
    chosen = plan(tree.nodes, hot_excess, cold_excess, strategy)
    assert entries(tree) == before and plan(tree.nodes, hot_excess, cold_excess, strategy) == chosen  # pure
    for kind, victims, excess in ((Kind.HOT, chosen.hot, hot_excess), (Kind.COLD, chosen.cold, cold_excess)):
        ids = [c.node_id for c, _ in victims]
        assert len(set(ids)) == len(ids)
        for c, key in victims:
            node = tree.nodes[c.node_id]
            entry = node.hot if kind is Kind.HOT else node.cold
            assert c.kind is kind and entry is not None and c.nbytes == entry.nbytes and node.pins == 0
            assert c.forced == node.dead and key == strategy.key(c)
        freed = 0
        for c, _ in victims:  # forced ones first; then one more only while the excess is not freed yet
            assert c.forced or freed < excess, "evicted more than was asked"
            freed += c.nbytes
        assert all(c.forced for c, _ in victims[:sum(c.forced for c, _ in victims)])
        if kind is Kind.HOT:
            possible = {n.id for n in tree.nodes.values() if n.hot is not None and n.pins == 0}
            forced = {i for i in possible if tree.nodes[i].dead}
            unforced = [key for c, key in victims if not c.forced]
            assert unforced == sorted(unforced)  # lowest key first
        else:
            possible = removable_cold(tree)
            forced = {i for i in possible if tree.nodes[i].dead}
        assert forced <= set(ids) <= possible
        available = sum((tree.nodes[i].hot if kind is Kind.HOT else tree.nodes[i].cold).nbytes  # type: ignore[union-attr]
                        for i in possible)
        assert freed >= excess if available >= excess else set(ids) == possible
    gone: set[int] = set()
    for c, _ in chosen.cold:  # leaves first: no checkpoint goes while a delta on it stays
        assert cold_evictable(tree.nodes[c.node_id], gone)
        gone.add(c.node_id)


@SETTINGS
@given(spec=specs(), hot_budget=st.none() | st.integers(0, 150), cold_budget=st.none() | st.integers(0, 150),
       cost=st.booleans())
def test_evict_applies_exactly_the_plan(spec: list[Spec], hot_budget: int | None, cold_budget: int | None,
                                        cost: bool) -> None:
    strategy = CostAware() if cost else LRU()
    tree, _ = build(spec, strategy=strategy)
    tree.hot_budget, tree.cold_budget = hot_budget, cold_budget
    chosen = plan(tree.nodes, tree.bytes_hot - hot_budget if hot_budget is not None else 0,
                  tree.bytes_cold - cold_budget if cold_budget is not None else 0, strategy)
    inflation = {kind: chosen.inflation(kind, tree.inflation[kind]) for kind in Kind}
    out = tree.evict()
    assert [n.id for n, _ in out.hot] == [c.node_id for c, _ in chosen.hot]
    assert [n.id for n, _ in out.cold] == [c.node_id for c, _ in chosen.cold]
    assert tree.inflation == inflation
    assert all(n.hot is None for n, _ in out.hot) and all(n.cold is None for n, _ in out.cold)
    tree.check(budgets=True)


def test_the_inflation_is_the_largest_key_of_an_unforced_victim() -> None:
    spec = [Spec(-1, 0.0, None, None, False, 0, 0.0, 0, False),
            Spec(0, 1.0, 10, None, False, 0, 5.0, 0, False),
            Spec(0, 1.0, 10, None, False, 0, 7.0, 0, False),
            Spec(0, 1.0, 10, None, False, 0, 9.0, 0, True)]  # non-cacheable: forced, whatever its key
    tree, (_, a, b, dead) = build(spec)
    chosen = plan(tree.nodes, 25, 0, LRU())  # the forced one frees 10 of them, a and b the rest
    assert [c.node_id for c, _ in chosen.hot] == [dead.id, a.id, b.id]
    assert chosen.inflation(Kind.HOT, 0.0) == 7.0 and chosen.inflation(Kind.HOT, 8.0) == 8.0
    assert chosen.inflation(Kind.COLD, 3.0) == 3.0 and EvictionPlan((), ()).inflation(Kind.HOT, 1.0) == 1.0
