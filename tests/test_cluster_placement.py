"""The cluster's pure decisions: where a group goes (fork locality, free memory, slots, budgets, first come first
served) and the ledger (every sample ends exactly once across dead nodes and retries)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.engine.cluster.placement import Ledger, LedgerError, NodeView, Work, app_key, place, works
from bunshin.engine.errors import BadRequest
from bunshin.engine.records import RolloutRequest, TaskSpec

MiB = 1 << 20


def work(task: str = "t", n: int = 2, app: str = "shop", seed: int = 0, samples: tuple[int, ...] | None = None) -> Work:
    request = RolloutRequest(task=TaskSpec(suite="s", task_id=task), group_size=n, seed=seed, group_id=f"{seed}:{task}")
    return Work(request=request, app=app, samples=samples if samples is not None else tuple(range(n)))


def node(name: str, **kw) -> NodeView:
    kw.setdefault("slots", 4)
    return NodeView(node_id=name, **kw)


def test_a_group_goes_where_its_root_lives_even_with_less_free_memory() -> None:
    nodes = [node("a", budget=1000 * MiB, charge=100 * MiB), node("b", budget=1000 * MiB, charge=600 * MiB,
                                                                  roots=frozenset({"shop"}), in_flight=1)]
    placed, _ = place([work()], nodes, root_estimate=100 * MiB)
    assert [n for _, n in placed] == ["b"]


def test_with_the_prefix_cache_a_group_goes_where_its_tasks_prefix_lives_before_its_root() -> None:
    nodes = [node("a", roots=frozenset({"shop"}), in_flight=0), node("b", roots=frozenset({"shop"}), in_flight=3,
                                                                    prefixes=frozenset({"t"}))]
    placed, views = place([work("t"), work("u", seed=1)], nodes, prefixes=True)
    assert [n for _, n in placed] == ["b", "a"]  # the task's prefix first, then the least busy root
    assert views[1].prefixes == {"t"} and views[0].prefixes == {"u"}
    placed, views = place([work("t"), work("t", seed=1)], [node("a"), node("b")], prefixes=True)
    assert [n for _, n in placed] == ["a", "a"]  # the second group follows the prefix the first one makes
    placed, views = place([work("t"), work("t", seed=1)], [node("a"), node("b")])
    assert all(not v.prefixes for v in views)  # without the cache no node holds a prefix


def test_a_new_root_goes_where_memory_is_free() -> None:
    nodes = [node("a", budget=1000 * MiB, charge=500 * MiB, in_flight=1),
             node("b", budget=1000 * MiB, charge=100 * MiB, in_flight=1),
             node("c", budget=1000 * MiB, charge=300 * MiB, in_flight=1)]
    placed, _ = place([work()], nodes, root_estimate=100 * MiB)
    assert [n for _, n in placed] == ["b"]


def test_without_budgets_the_least_busy_node_then_the_first() -> None:
    nodes = [node("a", in_flight=2), node("b", in_flight=1), node("c", in_flight=1)]
    assert [n for _, n in place([work()], nodes)[0]] == ["b"]
    assert [n for _, n in place([work()], [node("a"), node("b")])[0]] == ["a"]


def test_a_root_node_that_does_not_fit_is_passed_over_for_one_that_does() -> None:
    nodes = [node("a", budget=1000 * MiB, charge=950 * MiB, roots=frozenset({"shop"}), in_flight=1),
             node("b", budget=1000 * MiB, charge=0, in_flight=1)]
    placed, _ = place([work(n=2)], nodes, root_estimate=100 * MiB)
    assert [n for _, n in placed] == ["b"]


def test_work_waits_when_nothing_fits_and_keeps_its_turn() -> None:
    nodes = [node("a", budget=1000 * MiB, charge=900 * MiB, in_flight=1)]
    big, small = work("big", n=4), work("small", n=1)
    placed, views = place([big, small], nodes, root_estimate=0)
    assert placed == [] and views == nodes  # the small one does not pass the big one


def test_an_idle_node_takes_a_group_larger_than_its_budget() -> None:
    nodes = [node("a", budget=10 * MiB, charge=0)]
    placed, _ = place([work(n=8)], nodes)
    assert [n for _, n in placed] == ["a"]


def test_slots_bound_what_a_node_is_sent() -> None:
    nodes = [node("a", slots=3), node("b", slots=3)]
    placed, views = place([work(str(i), n=2) for i in range(5)], nodes)
    # locality fills a (its root) while it has a free slot: 2, then 4 in flight (>= 3: full); then b the same way
    assert [n for _, n in placed] == ["a", "a", "b", "b"]
    assert [v.in_flight for v in views] == [4, 4]


def test_groups_placed_together_follow_the_root_just_placed() -> None:
    nodes = [node("a", budget=1000 * MiB, slots=8), node("b", budget=1000 * MiB, charge=10 * MiB, slots=8)]
    placed, views = place([work("1"), work("2", app="other"), work("3")], nodes, root_estimate=100 * MiB)
    assert [n for _, n in placed] == ["a", "b", "a"]
    assert views[0].roots == {"shop"} and views[1].roots == {"other"}
    assert views[0].sent_since_report == 4


def test_dead_nodes_take_nothing() -> None:
    assert place([work()], [node("a", alive=False)])[0] == []


def test_the_projected_memory_counts_what_was_sent_since_the_last_report() -> None:
    view = node("a", budget=1000 * MiB, charge=100 * MiB, estimate=100 * MiB, sent_since_report=5, in_flight=1)
    assert view.projected() == 600 * MiB
    assert not view.fits(work(n=4, app="x"), root_estimate=100 * MiB)
    assert view.fits(work(n=4, app="x"), root_estimate=0)


def test_works_and_app_keys() -> None:
    requests = [RolloutRequest(task=TaskSpec(suite="s", task_id=i), group_size=3, group_id=i) for i in "ab"]
    got = works(requests, {"a": app_key(b"{}")})
    assert [(w.app, w.samples) for w in got] == [(app_key(b"{}"), (0, 1, 2)), ("", (0, 1, 2))]
    assert got[0].as_request().samples == [0, 1, 2]
    with pytest.raises(BadRequest, match="samples"):
        works([RolloutRequest(task=TaskSpec(suite="s", task_id="a"), group_size=2, samples=[2])], {})


def test_the_ledger_delivers_each_sample_once() -> None:
    ledger = Ledger()
    w = work(n=3)
    ledger.add(w)
    with pytest.raises(LedgerError):
        ledger.add(w)
    ledger.send(w, "a")
    assert ledger.in_flight("a") == 3
    assert ledger.deliver(w.group_id, 0, "a") is True
    assert ledger.deliver(w.group_id, 0, "a") is False  # a duplicate
    assert ledger.deliver(w.group_id, 1, "b") is False  # not sent there
    back = ledger.lost("a")
    assert [(x.samples, x.attempts) for x in back] == [((1, 2), 1)]
    assert ledger.deliver(w.group_id, 1, "a") is False  # a late result of the dead node
    with pytest.raises(LedgerError):
        ledger.send(w, "b")  # sample 0 is delivered already: only the lost ones go again
    ledger.send(back[0], "b")
    assert ledger.attempts[(w.group_id, 1)] == 2 and ledger.attempts[(w.group_id, 0)] == 1
    assert ledger.deliver(w.group_id, 2, "b")
    assert ledger.close_sent(back[0], "b") == [1]  # the agent ended without it: it ends (failed), once
    assert ledger.done()


def test_abandoned_work_ends_once() -> None:
    ledger = Ledger()
    w = work(n=2)
    ledger.add(w)
    assert ledger.abandon(w) == [0, 1]
    assert ledger.abandon(w) == [] and ledger.done()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["place", "deliver", "kill"]), st.integers(0, 50)), max_size=80),
       st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_whatever_nodes_die_every_sample_ends_exactly_once(events, sizes) -> None:
    """A model of the driver: nodes die at any moment, results come in any order; at the end (every sample sent
    is delivered or, with no node left, abandoned) each sample was passed on exactly once."""
    nodes = {name: node(name, slots=3) for name in "abc"}
    batch = [work(str(i), n=k) for i, k in enumerate(sizes)]
    ledger = Ledger()
    for w in batch:
        ledger.add(w)
    waiting = list(batch)
    passed: list[tuple[str, int]] = []
    counter = itertools.count()

    def step(kind: str, pick: int) -> None:
        alive = [n for n, v in nodes.items() if v.alive]
        if kind == "place":
            views = [NodeView(node_id=n, slots=v.slots, alive=v.alive, in_flight=ledger.in_flight(n))
                     for n, v in nodes.items()]
            placed, _ = place(list(waiting), views)
            for w, n in placed:
                waiting.remove(w)
                ledger.send(w, n)
        elif kind == "deliver":
            sent = [(k, n) for n in alive for k in ledger.sent.get(n, {})]
            if sent:
                (g, s), n = sent[pick % len(sent)]
                if ledger.deliver(g, s, n):
                    passed.append((g, s))
        elif kind == "kill" and len(alive) > 1 and next(counter) < 2:
            n = alive[pick % len(alive)]
            nodes[n] = NodeView(node_id=n, slots=3, alive=False)
            waiting[:0] = ledger.lost(n)

    for kind, pick in events:
        step(kind, pick)
    for _ in range(500):  # drain
        if ledger.done():
            break
        step("place", 0)
        step("deliver", 0)
    assert ledger.done()
    assert sorted(passed) == sorted((w.group_id, s) for w in batch for s in w.samples)
