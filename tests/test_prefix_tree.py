"""The prefix tree as a pure data structure: no workspace, no disk, an injected clock. Unit tests of each operation,
then a hypothesis state machine against a dictionary model (pins protect, evictable + pinned = total, namespaces
never share nodes, every node's state reachable by replay, budgets hold once evictions are applied)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bunshin.engine.prefix.errors import PrefixError, TreeMisuse
from bunshin.engine.prefix.eviction import LRU, Candidate, CostAware, candidate, choose
from bunshin.engine.prefix.node import Kind, Namespace, State
from bunshin.engine.prefix.tree import Admission, ForkHot, PrefixTree, RebuildPlan, RestoreCold, SetUp
from bunshin.envs.records import ToolCall, canonical

MiB = 1 << 20
NS_A = Namespace(suite="webshop", task_id="1", config=Namespace.digest("cfg", 1))
NS_B = Namespace(suite="webshop", task_id="2", config=Namespace.digest("cfg", 1))
NS_C = Namespace(suite="webshop", task_id="1", config=Namespace.digest("cfg", 2))  # same task, new code


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def call(i: int, name: str = "click") -> ToolCall:
    return ToolCall(name=name, args={"element": i})


def tree(**kw: object) -> tuple[PrefixTree, Clock]:
    clock = Clock()
    kw.setdefault("admission", Admission(min_issuers=1))
    return PrefixTree(clock=clock, **kw), clock  # type: ignore[arg-type]


def issued(parent, c: ToolCall) -> int:
    """Distinct issuers of ``c`` from ``parent`` not yet admitted."""
    return len(parent.issues.get(canonical(c), ()))


def over_budget(t: PrefixTree) -> bool:
    return any(budget is not None and used > budget
               for used, budget in ((t.bytes_hot, t.hot_budget), (t.bytes_cold, t.cold_budget)))


def chain(t: PrefixTree, ns: Namespace, *calls: ToolCall, tool_s: float = 1.0):
    node = t.root(ns)
    for c in calls:
        node = t.add(node, c, f"obs {c.args}", tool_s)
        assert node is not None
    return node


# -- structure and namespaces -----------------------------------------------------------------------------------


def test_namespaces_never_share_nodes_even_for_equal_calls() -> None:
    t, _ = tree()
    a, b, c = (chain(t, ns, call(1), call(2)) for ns in (NS_A, NS_B, NS_C))
    assert len({a.id, b.id, c.id}) == 3 and len(t.roots) == 3
    assert t.lookup(NS_B, [call(1), call(2), call(3)]) is b
    assert t.lookup(NS_A, [call(1), call(9)]) is a.parent
    assert t.lookup(NS_A, [call(9)]) is t.roots[NS_A]
    assert t.lookup(Namespace(suite="x", task_id="1", config="y"), [call(1)]) is None
    assert a.calls() == [call(1), call(2)] and a.depth == 2 and a.state is State.ABSENT
    t.check()


def test_the_key_is_the_canonical_call_argument_order_aside() -> None:
    t, _ = tree()
    node = chain(t, NS_A, ToolCall(name="type", args={"a": 1, "b": "x"}))
    assert t.child(t.roots[NS_A], ToolCall(name="type", args={"b": "x", "a": 1})) is node
    assert node.key == canonical(node.call)


def test_a_node_digest_is_stable_across_trees_and_distinct_across_namespaces() -> None:
    t1, _ = tree()
    t2, _ = tree()
    chain(t2, NS_B, call(7))
    a1, a2, b = chain(t1, NS_A, call(1), call(2)), chain(t2, NS_A, call(1), call(2)), chain(t2, NS_B, call(1), call(2))
    assert a1.digest == a2.digest != b.digest and a1.id != a2.id
    assert a1.parent.digest != a1.digest != t1.roots[NS_A].digest
    assert t2.by_digest[b.digest] is b


def test_a_node_of_another_tree_is_refused() -> None:
    t1, _ = tree()
    t2, _ = tree()
    with pytest.raises(TreeMisuse, match="not a node of this tree") as caught:
        t2.pin(t1.root(NS_A))
    assert isinstance(caught.value, PrefixError)


# -- admission --------------------------------------------------------------------------------------------------


def test_a_call_becomes_a_node_when_a_second_issuer_issues_it_from_the_same_node() -> None:
    t, _ = tree(admission=Admission())
    root = t.root(NS_A)
    assert t.add(root, call(1), "o", 2.0, issuer=("epoch0", 0)) is None
    assert t.add(root, call(1), "o", 2.0, issuer=("epoch0", 0)) is None  # the same sample again: still one
    assert issued(root, call(1)) == 1
    assert t.add(root, call(2), "o", 2.0, issuer=("epoch0", 1)) is None  # another call: counted apart
    node = t.add(root, call(1), "o", 2.0, issuer=("epoch1", 0))  # the same sample in a later epoch
    assert node is not None and issued(root, call(1)) == 0 and issued(root, call(2)) == 1
    assert t.add(root, call(1), "other", 2.0, issuer=("epoch1", 5)) is node  # already a node: returned as is
    s = t.statistics()
    assert (s.admitted, s.refused) == (1, 3)
    t.check()


def test_nothing_is_admitted_at_or_below_a_non_cacheable_call() -> None:
    t, _ = tree()
    root = t.root(NS_A)
    assert t.add(root, call(1, "random"), "o", 1.0, non_cacheable=True) is None
    rnd = root.children[canonical(call(1, "random"))]
    assert rnd.non_cacheable and t.child(root, call(1, "random")) is None
    assert t.add(root, call(1, "random"), "o", 1.0) is None  # never admitted again
    assert t.add(rnd, call(2), "o", 1.0) is None
    t.check()


# -- the walk ---------------------------------------------------------------------------------------------------


def test_walk_counts_hits_misses_and_the_tool_seconds_skipped() -> None:
    t, clock = tree()
    chain(t, NS_A, call(1), call(2), tool_s=1.5)
    node = t.root(NS_A)
    clock.t = 200.0
    for c in (call(1), call(2)):
        node = t.walk(node, c)
        assert node is not None and node.last_used == 200.0 and node.hits == 1
    assert t.walk(node, call(3)) is None
    s = t.statistics()
    assert (s.hits, s.misses, s.tool_s_skipped) == (2, 1, 3.0) and s.hit_rate == pytest.approx(2 / 3)


# -- pins -------------------------------------------------------------------------------------------------------


def test_pins_count_release_once_and_move_down_a_walk() -> None:
    t, _ = tree()
    a = chain(t, NS_A, call(1))
    b = chain(t, NS_A, call(1), call(2))
    with t.pin(a) as pin:
        assert a.pins == 1
        pin.move(b)
        assert (a.pins, b.pins) == (0, 1)
        second = t.pin(b)
        second.release()
        second.release()  # idempotent
        assert b.pins == 1
    assert b.pins == 0 and pin.released
    pin.release()
    with pytest.raises(TreeMisuse):
        pin.move(a)
    with pytest.raises(TreeMisuse):
        t._unpin(a)


# -- entries ----------------------------------------------------------------------------------------------------


def test_hot_and_cold_entries_and_their_bytes() -> None:
    t, _ = tree()
    node = chain(t, NS_A, call(1))
    assert t.set_hot(node, "snap1", 10) is None
    assert t.set_hot(node, "snap2", 20).handle == "snap1"  # replaced: the engine closes the old one
    assert t.set_cold(node, "ck1", 5) == [] and node.state is State.BOTH
    assert (t.bytes_hot, t.bytes_cold) == (20, 5)
    assert t.drop_hot(node).handle == "snap2" and node.state is State.COLD
    assert t.drop_hot(node) is None
    with pytest.raises(TreeMisuse):
        t.set_hot(node, "x", -1)
    t.check()


def test_a_delta_needs_its_base_and_dropping_a_base_drops_the_deltas_on_it() -> None:
    t, _ = tree()
    a = chain(t, NS_A, call(1))
    b = chain(t, NS_A, call(1), call(2))
    c = chain(t, NS_A, call(1), call(2), call(3))
    with pytest.raises(TreeMisuse):
        t.set_cold(b, "b", 1, delta=True)
    t.set_cold(a, "a", 10)
    t.set_cold(b, "b", 1, delta=True)
    t.set_cold(c, "c", 1, delta=True)
    t.check()
    dropped = t.drop_cold(a)  # a corrupt base: everything built on it goes with it
    assert [n.id for n, _ in dropped] == [a.id, b.id, c.id] and t.bytes_cold == 0
    t.check()


# -- eviction ---------------------------------------------------------------------------------------------------


def test_lru_evicts_the_least_recently_used_unpinned_snapshots_until_under_budget() -> None:
    t, clock = tree(hot_budget=25)
    nodes = [chain(t, NS_A, call(i)) for i in range(4)]
    for i, n in enumerate(nodes):
        clock.t = 100.0 + i
        t.set_hot(n, f"s{i}", 10)
    pin = t.pin(nodes[0])  # the oldest, but a sample stands on it
    out = t.evict()
    assert [n.id for n, _ in out.hot] == [nodes[1].id, nodes[2].id]
    assert [e.handle for _, e in out.hot] == ["s1", "s2"] and t.bytes_hot == 20
    assert not over_budget(t) and not t.evict()
    t.check(budgets=True)
    pin.release()
    assert t.fits_hot(25) and not t.fits_hot(26)


def test_when_only_pinned_entries_are_left_the_tree_stays_over_budget_until_released() -> None:
    t, _ = tree(hot_budget=5)
    a, b = chain(t, NS_A, call(1)), chain(t, NS_A, call(2))
    t.set_hot(a, "a", 10)
    t.set_hot(b, "b", 10)
    pa, pb = t.pin(a), t.pin(b)
    assert not t.evict() and over_budget(t) and not t.fits_hot(1)
    t.check(budgets=True)
    pa.release()
    assert [n for n, _ in t.evict().hot] == [a] and over_budget(t)
    pb.release()
    assert [n for n, _ in t.evict().hot] == [b] and not over_budget(t)
    t.check(budgets=True)


def test_an_ancestor_snapshot_may_go_while_a_descendant_is_pinned_but_not_its_checkpoint_base() -> None:
    t, _ = tree(hot_budget=0, cold_budget=0)
    a = chain(t, NS_A, call(1))
    b = chain(t, NS_A, call(1), call(2))
    t.set_hot(a, "a", 10)
    t.set_hot(b, "b", 10)
    t.set_cold(a, "a", 10)
    t.set_cold(b, "b", 2, delta=True)
    pin = t.pin(b)
    out = t.evict()
    assert [n for n, _ in out.hot] == [a] and out.cold == []  # a snapshot stands alone; a delta does not
    assert a.state is State.COLD and b.state is State.BOTH
    t.check(budgets=True)
    pin.release()
    out = t.evict()
    assert [n for n, _ in out.cold] == [b, a]  # leaves first, then the base they freed
    assert t.bytes_cold == t.bytes_hot == 0
    t.check(budgets=True)


def test_cost_aware_keeps_what_saves_the_most_tool_seconds_per_byte() -> None:
    t, clock = tree(hot_budget=100, strategy=CostAware())
    cheap = chain(t, NS_A, call(1), tool_s=0.1)
    dear = chain(t, NS_B, call(1), tool_s=30.0)
    t.set_hot(dear, "dear", 60)  # older, bigger, but 30 s of tool time behind it
    clock.t += 10
    t.set_hot(cheap, "cheap", 60)
    assert [n for n, _ in t.evict().hot] == [cheap]
    t2, clock2 = tree(hot_budget=100, strategy=LRU())
    cheap2, dear2 = chain(t2, NS_A, call(1), tool_s=0.1), chain(t2, NS_B, call(1), tool_s=30.0)
    t2.set_hot(dear2, "dear", 60)
    clock2.t += 10
    t2.set_hot(cheap2, "cheap", 60)
    assert [n for n, _ in t2.evict().hot] == [dear2]


def test_cost_aware_ages_entries_through_the_inflation_value() -> None:
    s = CostAware()
    old = Candidate(node_id=1, kind=Kind.HOT, nbytes=MiB, last_used=0, hits=0, saved_s=5.0, inflation=0.0)
    new = Candidate(node_id=2, kind=Kind.HOT, nbytes=MiB, last_used=9, hits=0, saved_s=1.0, inflation=10.0)
    assert [c.node_id for c, _ in choose([old, new], 1, s)] == [1]  # used before L rose: goes first


def test_saved_seconds_count_back_to_the_nearest_ancestor_with_an_entry() -> None:
    t, _ = tree()
    a = chain(t, NS_A, call(1), tool_s=2.0)
    c = chain(t, NS_A, call(1), call(2), call(3), tool_s=2.0)
    t.set_hot(c, "c", 1)
    assert candidate(c, Kind.HOT).saved_s == 6.0
    t.set_cold(a, "a", 1)
    assert candidate(c, Kind.HOT).saved_s == 4.0


# -- replay and non-cacheable calls -----------------------------------------------------------------------------


def test_a_rebuild_forks_the_nearest_snapshot_else_restores_where_that_pays_else_sets_up() -> None:
    t, _ = tree()
    c = chain(t, NS_A, call(1), call(2), call(3))
    root, a, b = t.roots[NS_A], c.parent.parent, c.parent
    plan = t.plan_rebuild(c, restore_s=0.5)
    assert plan.start == SetUp(root) and plan.replay == (a, b, c)  # nothing has an entry: set up afresh
    t.set_cold(a, "a", 1)
    plan = t.plan_rebuild(c, restore_s=0.5)
    assert plan.start == RestoreCold(a) and plan.replay == (b, c)  # 0.5 + 2 s of calls < 3 s
    assert t.plan_rebuild(c, restore_s=1.0).start == SetUp(root)  # 1 + 2 is not less than 3: a restore costs more
    assert t.plan_rebuild(c, restore_s=None).start == SetUp(root)  # this run cannot restore
    t.set_hot(root, "root", 1)
    plan = t.plan_rebuild(c, restore_s=0.0)
    assert plan.start == ForkHot(root) and plan.replay == (a, b, c)  # a fork beats a nearer restore
    t.set_hot(c, "c", 1)
    assert t.plan_rebuild(c, restore_s=0.0) == RebuildPlan(ForkHot(c), ())


def test_a_non_cacheable_subtree_serves_nothing_and_its_entries_go_once_unpinned() -> None:
    t, _ = tree(hot_budget=1000)
    a = chain(t, NS_A, call(1))
    b = chain(t, NS_A, call(1), call(2))
    t.set_hot(a, "a", 1)
    t.set_hot(b, "b", 1)
    pin = t.pin(b)
    t.mark_non_cacheable(a)
    assert t.lookup(NS_A, [call(1), call(2)]) is t.roots[NS_A] and t.walk(t.roots[NS_A], call(1)) is None
    assert [n for n, _ in t.evict().hot] == [a]  # under budget, but nothing can use it
    t.check(budgets=True)
    pin.release()
    assert [n for n, _ in t.evict().hot] == [b]
    t.check(budgets=True)


def test_a_non_cacheable_chain_of_checkpoints_goes_once_each_leaves_first() -> None:
    """Regression: a base whose only child is not a delta is a candidate from the start; it must not be offered
    again when that child goes."""
    t, clock = tree()
    a = chain(t, NS_A, call(1))
    b = chain(t, NS_A, call(1), call(2))
    clock.t += 1
    t.touch(a)  # b is the least recently used: it goes first
    t.set_cold(t.roots[NS_A], "root", 5)
    t.set_cold(a, "a", 1, delta=True)
    t.set_cold(b, "b", 2)  # written whole
    t.mark_non_cacheable(a)
    out = t.evict()
    assert sorted(n.id for n, _ in out.cold) == sorted([a.id, b.id]) and t.roots[NS_A].cold is not None
    t.check(budgets=True)


# -- the state machine ------------------------------------------------------------------------------------------

NAMESPACES = [NS_A, NS_B, NS_C]
CALLS = [call(i, name) for name in ("click", "type") for i in range(2)]


class PrefixTreeMachine(RuleBasedStateMachine):
    """Random adds, walks, pins, entries, drops and evictions in three namespaces against a dictionary model keyed
    by (namespace, canonical path)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.model: dict[tuple, dict] = {}  # (ns, keys...) -> {"hot", "cold", "pins", "dead"}
        self.issues: dict[tuple, set] = {}  # (ns, keys..., key) -> issuers
        self.pins: list = []

    @initialize(hot=st.none() | st.integers(0, 150), cold=st.none() | st.integers(0, 150),
                strategy=st.sampled_from([LRU, CostAware]), min_issuers=st.integers(1, 2))
    def start(self, hot: int | None, cold: int | None, strategy: type, min_issuers: int) -> None:
        self.min_issuers = min_issuers
        self.tree = PrefixTree(hot_budget=hot, cold_budget=cold, clock=self.clock, strategy=strategy(),
                               admission=Admission(min_issuers))
        for ns in NAMESPACES:
            self.tree.root(ns)
            self.model[(ns,)] = {"hot": None, "cold": None, "pins": 0, "dead": False}

    def path(self, node) -> tuple:
        return (node.ns, *(canonical(c) for c in node.calls()))

    def draw_node(self, data: st.DataObject):
        return self.tree.nodes[data.draw(st.sampled_from(sorted(self.tree.nodes)), label="node id")]

    @rule(dt=st.floats(0, 10))
    def tick(self, dt: float) -> None:
        self.clock.t += dt

    @rule(ns=st.sampled_from(NAMESPACES), calls=st.lists(st.sampled_from(CALLS), min_size=1, max_size=5),
          issuer=st.integers(0, 2), tool_s=st.floats(0, 5))
    def add_along(self, ns: Namespace, calls: list[ToolCall], issuer: int, tool_s: float) -> None:
        """A sample's episode: walk while the calls match, then add each executed call (until one is refused)."""
        node = self.tree.root(ns)
        for c in calls:
            found = self.tree.walk(node, c)
            if found is None:
                found = self.add_one(node, c, issuer, tool_s)
            if found is None:
                return
            node = found

    @rule(data=st.data(), c=st.sampled_from(CALLS), issuer=st.integers(0, 2), tool_s=st.floats(0, 5))
    def add(self, data: st.DataObject, c: ToolCall, issuer: int, tool_s: float) -> None:
        declared = data.draw(st.sampled_from([False, False, False, True]), label="declared non-cacheable")
        self.add_one(self.draw_node(data), c, issuer, tool_s, declared)

    def add_one(self, parent, c: ToolCall, issuer: int, tool_s: float, declared: bool = False):
        key, ppath = canonical(c), self.path(parent)
        existed = (*ppath, key) in self.model
        node = self.tree.add(parent, c, ("obs", ppath, key), tool_s, issuer=issuer, non_cacheable=declared)
        if self.model[ppath]["dead"] or any(self.model[ppath[:i]]["dead"] for i in range(1, len(ppath))):
            assert node is None
            return None
        if existed:  # returned as it is, unless it is non-cacheable
            if self.model[(*ppath, key)]["dead"]:
                assert node is None
            else:
                assert node is self.tree.nodes[node.id] and self.path(node) == (*ppath, key)
            return node
        if declared:  # recorded at once, serving nothing
            assert node is None and issued(parent, c) == 0
            self.model[(*ppath, key)] = {"hot": None, "cold": None, "pins": 0, "dead": True}
            self.issues.pop((*ppath, key), None)
            return None
        issuers = self.issues.setdefault((*ppath, key), set())
        issuers.add(issuer)
        if len(issuers) >= self.min_issuers:
            assert node is not None and node.observation == ("obs", ppath, key) and node.state is State.ABSENT
            self.model[(*ppath, key)] = {"hot": None, "cold": None, "pins": 0, "dead": False}
            del self.issues[(*ppath, key)]
        else:
            assert node is None
        return node

    @rule(ns=st.sampled_from(NAMESPACES), calls=st.lists(st.sampled_from(CALLS), max_size=5))
    def lookup(self, ns: Namespace, calls: list[ToolCall]) -> None:
        found = self.tree.lookup(ns, calls)
        expect = (ns,)
        for c in calls:
            nxt = (*expect, canonical(c))
            if nxt not in self.model or self.model[nxt]["dead"]:
                break
            expect = nxt
        assert found is not None and self.path(found) == expect and found.ns == ns

    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        node = self.draw_node(data)
        self.pins.append(self.tree.pin(node))
        self.model[self.path(node)]["pins"] += 1

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        pin = self.pins.pop(data.draw(st.integers(0, len(self.pins) - 1)))
        self.model[self.path(pin.node)]["pins"] -= 1
        pin.release()

    @rule(data=st.data(), nbytes=st.integers(0, 80))
    def set_hot(self, data: st.DataObject, nbytes: int) -> None:
        node = self.draw_node(data)
        self.tree.set_hot(node, ("snap", node.id, nbytes), nbytes)
        self.model[self.path(node)]["hot"] = nbytes

    @rule(data=st.data(), nbytes=st.integers(0, 80), delta=st.booleans())
    def set_cold(self, data: st.DataObject, nbytes: int, delta: bool) -> None:
        node = self.draw_node(data)
        delta = delta and node.parent is not None and node.parent.cold is not None
        self.tree.set_cold(node, f"ck{node.id}", nbytes, delta=delta)
        self.model_drop_cold(self.path(node))
        self.model[self.path(node)]["cold"] = (nbytes, delta)

    @rule(data=st.data(), nbytes=st.integers(0, 30))
    def set_cold_chain(self, data: st.DataObject, nbytes: int) -> None:
        """Checkpoints from the root down to a node, each a delta on its parent's (as the writers make them)."""
        node = self.draw_node(data)
        for n in reversed(list(node.ancestors())):
            if n.cold is None:
                self.tree.set_cold(n, f"ck{n.id}", nbytes, delta=n.parent is not None)
                self.model[self.path(n)]["cold"] = (nbytes, n.parent is not None)

    def model_drop_cold(self, path: tuple) -> None:
        self.model[path]["cold"] = None
        for other, entry in self.model.items():
            if len(other) == len(path) + 1 and other[:-1] == path and entry["cold"] and entry["cold"][1]:
                self.model_drop_cold(other)

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        node = self.draw_node(data)
        if data.draw(st.booleans()):
            self.tree.drop_hot(node)
            self.model[self.path(node)]["hot"] = None
        else:
            self.tree.drop_cold(node)
            self.model_drop_cold(self.path(node))

    @precondition(lambda self: any(len(p) > 1 for p in self.model))
    @rule(data=st.data())
    def mark_non_cacheable(self, data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(sorted((p for p in self.model if len(p) > 1), key=repr)))
        node = self.tree.lookup(path[0], [])
        for key in path[1:]:
            node = node.children[key]
        self.tree.mark_non_cacheable(node)
        self.model[path]["dead"] = True

    @rule()
    def evict(self) -> None:
        out = self.tree.evict()
        for node, entry in out.hot:
            m = self.model[self.path(node)]
            assert m["pins"] == 0 and m["hot"] == entry.nbytes, "evicted a pinned or unknown snapshot"
            m["hot"] = None
        for node, entry in out.cold:
            m = self.model[self.path(node)]
            assert m["pins"] == 0 and m["cold"][0] == entry.nbytes, "evicted a pinned or unknown checkpoint"
            m["cold"] = None
        self.tree.check(budgets=True)

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "tree"):
            return
        self.tree.check()
        assert {self.path(n) for n in self.tree.nodes.values()} == set(self.model)
        assert len(self.tree.nodes) == len(self.model)  # one node per (namespace, path): nothing shared
        for node in self.tree.nodes.values():
            m = self.model[self.path(node)]
            assert node.pins == m["pins"] and node.non_cacheable == m["dead"]
            assert (node.hot.nbytes if node.hot else None) == m["hot"]
            assert ((node.cold.nbytes, node.cold.delta) if node.cold else None) == m["cold"]
        with_entry = [p for p, m in self.model.items() if m["hot"] is not None or m["cold"] is not None]
        evictable = [p for p in with_entry if self.model[p]["pins"] == 0]
        assert len(self.tree.evictable()) == len(evictable)
        assert len(self.tree.evictable()) + len(self.tree.protected()) == len(with_entry)

    @invariant()
    def every_live_node_is_reachable_by_its_rebuild_plan(self) -> None:
        if not hasattr(self, "tree"):
            return
        for node in self.tree.nodes.values():
            if node.dead:
                continue
            for restore_s in (None, 0.0, 2.0):
                plan = self.tree.plan_rebuild(node, restore_s=restore_s)
                match plan.start:
                    case ForkHot(node=source):
                        assert source.hot is not None
                    case RestoreCold(node=source):
                        assert source.cold is not None and restore_s is not None
                    case SetUp(node=source):
                        assert source.parent is None
                for n in plan.replay:
                    source = self.tree.child(source, n.call)
                    assert source is n
                assert source is node


TestPrefixTreeMachine = PrefixTreeMachine.TestCase
TestPrefixTreeMachine.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
                                          derandomize=True, database=None)
