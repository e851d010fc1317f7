"""The prefix tree across runs (engine/prefix/persist.py): a round trip keeps structure, observations, statistics,
cold entries and digests (hot entries and pins are this run's); a corrupt, truncated or other-version file gives an
empty tree and a reason; stale namespaces and checkpoints gone from the store are dropped; a crash in the middle of
a save (SIGKILL in a subprocess) leaves the saved file whole; save(load(save(t))) == save(t) for random trees."""

from __future__ import annotations

import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.engine.prefix.node import Namespace, State
from bunshin.engine.prefix.persist import MAGIC, load_tree, save_tree
from bunshin.engine.prefix.tree import Admission, PrefixTree, SetUp
from bunshin.envs.records import Observation, ToolCall, canonical

NS_A = Namespace(suite="webshop", task_id="1", config=Namespace.digest("cfg", 1))
NS_B = Namespace(suite="desktop", task_id="2", config=Namespace.digest("cfg", 1))
NS_OLD = Namespace(suite="webshop", task_id="1", config=Namespace.digest("cfg", 0))


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def call(i: int, name: str = "click") -> ToolCall:
    return ToolCall(name=name, args={"element": i, "text": f"é{i}"})


def obs(i: int) -> Observation:
    return Observation(output=f"page {i}", exit_code=0, data={"screenshot": bytes([i % 256]) * 8, "n": i},
                       tool_seconds=0.5)


def sample_tree() -> tuple[PrefixTree, Clock]:
    clock = Clock()
    t = PrefixTree(clock=clock, admission=Admission(min_issuers=1))
    root = t.root(NS_A, obs(0))
    a = t.add(root, call(1), obs(1), 2.0)
    b = t.add(a, call(2), obs(2), 1.5)
    c = t.add(a, call(3), "plain text", 0.25)
    t.add(root, call(4, "random"), obs(4), 1.0, non_cacheable=True)
    t.set_cold(a, "ckpt-a", 1000)
    t.set_cold(b, "ckpt-b", 100, delta=True)
    t.set_hot(b, object(), 5000)  # hot + cold: comes back cold
    t.set_hot(c, object(), 7000)  # hot only: comes back absent
    t.admission = Admission(min_issuers=2)
    t.add(b, call(9), obs(9), 1.0, issuer="s0")  # an issue not admitted yet
    clock.t = 150.0
    assert t.walk(root, call(1)) is a and t.walk(a, call(2)) is b
    broot = t.root(NS_B, "desktop ready")
    t.admission = Admission(min_issuers=1)
    t.set_cold(t.add(broot, call(1), obs(5), 3.0), "ckpt-b1", 10)
    clock.t = 200.0
    t.pin(c)  # pins are not saved
    t.check()
    return t, clock


def shape(t: PrefixTree) -> dict[str, tuple]:
    return {n.digest: (n.ns, n.call, n.observation, n.tool_s, n.hits, n.last_used, n.non_cacheable, n.cold,
                       n.parent.digest if n.parent else None, {k: len(v) for k, v in n.issues.items()})
            for n in t.nodes.values()}


def test_a_round_trip_keeps_the_tree_but_not_its_hot_entries_or_pins(tmp_path: Path) -> None:
    t, clock = sample_tree()
    saved = save_tree(t, tmp_path / "tree")
    assert (saved.nodes, saved.skipped) == (7, 0) and (tmp_path / "tree").read_bytes()[:8] == MAGIC
    loaded = load_tree(tmp_path / "tree", clock=Clock(200.0))
    u = loaded.tree
    assert loaded.reason is None and loaded.nodes == 7 and list(u.roots) == [NS_A, NS_B]
    assert shape(u) == shape(t)
    states = {n.digest: n.state for n in u.nodes.values()}
    for n in t.nodes.values():
        assert states[n.digest] is {State.BOTH: State.COLD, State.HOT: State.ABSENT}.get(n.state, n.state)
    assert all(n.pins == 0 and n.hot is None for n in u.nodes.values())
    assert u.bytes_hot == 0 and u.bytes_cold == t.bytes_cold == 1110
    s = u.statistics()
    assert (s.hits, s.misses, s.admitted, s.nodes, s.nodes_cold) == (0, 0, 0, 7, 3)  # counters are per run
    a = u.lookup(NS_A, [call(1), call(2)])
    assert a.observation == obs(2) and isinstance(a.observation, Observation) and a.hits == 1
    assert u.child(u.roots[NS_A], call(4, "random")) is None  # still non-cacheable
    u.admission = Admission(min_issuers=2)
    assert u.add(a, call(9), obs(9), 1.0, issuer="tomorrow") is not None  # yesterday's issue counts
    u.check()


def test_a_missing_file_is_an_empty_tree_without_a_reason(tmp_path: Path) -> None:
    loaded = load_tree(tmp_path / "none", clock=Clock(), cold_budget=5)
    assert loaded.reason is None and not loaded.tree.nodes and loaded.tree.cold_budget == 5


def _flip(data: bytes) -> bytes:
    return data[:40] + bytes([data[40] ^ 0xFF]) + data[41:]


@pytest.mark.parametrize("damage", [
    pytest.param(_flip, id="flipped-byte"),
    pytest.param(lambda d: d[:len(d) // 2], id="truncated"),
    pytest.param(lambda d: d[:-1], id="last-byte-gone"),
    pytest.param(lambda d: b"", id="empty"),
    pytest.param(lambda d: d[:8] + (2).to_bytes(4, "little") + d[12:], id="other-version"),
    pytest.param(lambda d: b"NOTATREE" + d[8:], id="bad-magic"),
    pytest.param(lambda d: d + b"x", id="trailing-garbage"),
])
def test_a_damaged_file_gives_an_empty_tree_and_a_reason(tmp_path: Path, damage) -> None:
    t, _ = sample_tree()
    save_tree(t, tmp_path / "tree")
    (tmp_path / "tree").write_bytes(damage((tmp_path / "tree").read_bytes()))
    loaded = load_tree(tmp_path / "tree", clock=Clock())
    assert loaded.reason and "empty tree" in loaded.reason and not loaded.tree.nodes and not loaded.tree.roots


def test_a_body_with_a_valid_checksum_that_does_not_decode_gives_an_empty_tree(tmp_path: Path) -> None:
    body = b"\x93\x01\x02"
    (tmp_path / "tree").write_bytes(struct.pack("<8sIQ", MAGIC, 1, len(body)) + body
                                    + struct.pack("<I", zlib.crc32(body)))
    loaded = load_tree(tmp_path / "tree", clock=Clock())
    assert loaded.reason and not loaded.tree.nodes


def test_stale_namespaces_are_dropped_and_their_checkpoints_reported(tmp_path: Path) -> None:
    t, _ = sample_tree()
    old = t.root(NS_OLD)
    t.set_cold(t.add(old, call(1), "o", 1.0), "ckpt-old", 5)
    save_tree(t, tmp_path / "tree")
    for ok in ({NS_A, NS_B}, lambda ns: ns.config == NS_A.config):
        loaded = load_tree(tmp_path / "tree", clock=Clock(), namespace_ok=ok)
        assert list(loaded.tree.roots) == [NS_A, NS_B] and loaded.dropped_namespaces == [NS_OLD]
        assert loaded.stale_checkpoints == ["ckpt-old"] and loaded.reason is None
        loaded.tree.check()
    assert NS_OLD in load_tree(tmp_path / "tree", clock=Clock()).tree.roots  # None keeps all


def test_checkpoints_gone_from_the_store_become_absent_with_the_deltas_on_them(tmp_path: Path) -> None:
    t, _ = sample_tree()
    save_tree(t, tmp_path / "tree")
    loaded = load_tree(tmp_path / "tree", clock=Clock(), known_checkpoints={"ckpt-b", "ckpt-b1"})
    u = loaded.tree
    a, b = u.lookup(NS_A, [call(1)]), u.lookup(NS_A, [call(1), call(2)])
    assert a.state is b.state is State.ABSENT and loaded.absent == [a.digest, b.digest]
    assert u.lookup(NS_B, [call(1)]).state is State.COLD and u.bytes_cold == 10
    plan = u.plan_rebuild(b, restore_s=0.0)
    assert plan.start == SetUp(u.roots[NS_A]) and [n.call for n in plan.replay] == [call(1), call(2)]
    u.check()


def test_an_observation_that_cannot_be_encoded_leaves_its_subtree_out(tmp_path: Path) -> None:
    t, _ = sample_tree()
    a = t.lookup(NS_A, [call(1)])
    t.add(t.add(a, call(7), object(), 1.0), call(8), "o", 1.0)
    saved = save_tree(t, tmp_path / "tree")
    assert (saved.nodes, saved.skipped) == (7, 2)
    assert shape(load_tree(tmp_path / "tree", clock=Clock(200.0)).tree) == shape(sample_tree()[0])


def test_a_failed_save_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    t, _ = sample_tree()
    save_tree(t, tmp_path / "tree")
    before = (tmp_path / "tree").read_bytes()
    t.add(t.roots[NS_A], call(20), "new", 1.0)

    def crash(step: str) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(Exception, match="No space left") as info:
        save_tree(t, tmp_path / "tree", fault=crash)
    assert type(info.value).__name__ == "StoreFull"
    assert (tmp_path / "tree").read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["tree"]


def test_a_crash_in_the_middle_of_a_save_leaves_the_saved_file_whole(tmp_path: Path) -> None:
    t, _ = sample_tree()
    save_tree(t, tmp_path / "tree")
    before = (tmp_path / "tree").read_bytes()
    script = f"""
import os, signal
from bunshin.engine.prefix.persist import load_tree, save_tree
loaded = load_tree({str(tmp_path / "tree")!r}, clock=lambda: 1.0)
save_tree(loaded.tree, {str(tmp_path / "tree")!r}, fault=lambda step: os.kill(os.getpid(), signal.SIGKILL))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "tree"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tree.") and leftovers[0].endswith(".tmp")
    assert (tmp_path / "tree").read_bytes() == before
    loaded = load_tree(tmp_path / "tree", clock=Clock(200.0))
    assert loaded.reason is None and shape(loaded.tree) == shape(t)
    save_tree(loaded.tree, tmp_path / "tree")  # the next save clears what the crash left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]


# -- save(load(save(t))) == save(t) ------------------------------------------------------------------------------

OBSERVATIONS = st.one_of(
    st.none(), st.text(max_size=8), st.integers(-5, 5),
    st.builds(Observation, output=st.text(max_size=8), exit_code=st.none() | st.integers(0, 3),
              data=st.dictionaries(st.sampled_from(["a", "b"]), st.binary(max_size=4) | st.integers(0, 9))))
STEPS = st.lists(st.tuples(st.sampled_from(["add"] * 6 + ["walk", "hot", "cold", "cold", "delta", "delta", "mark", "tick"]),
                           st.integers(0, 40), st.integers(0, 3), OBSERVATIONS), min_size=20, max_size=60)


@settings(max_examples=150, deadline=None)
@given(steps=STEPS, min_issuers=st.sampled_from([1, 1, 2]))
def test_save_load_save_is_a_fixed_point(steps, min_issuers: int) -> None:
    clock = Clock(1000.0)
    t = PrefixTree(clock=clock, admission=Admission(min_issuers=min_issuers))
    for ns in (NS_A, NS_B):
        t.root(ns, "first")
    for op, i, j, observation in steps:
        nodes = [n for n in t.nodes.values() if op != "add" or not n.dead]
        node = nodes[-1 - i // 2 % min(3, len(nodes))] if i % 2 else nodes[i // 2 % len(nodes)]  # recent ones: deep paths
        if op == "add":
            t.add(node, call(j), observation, i / 8, issuer=i % 3, non_cacheable=(i % 17 == 16))
        elif op == "walk":
            t.walk(node, call(j))
        elif op == "hot":
            t.set_hot(node, object(), i)
        elif op == "cold":
            t.set_cold(node, f"c{node.digest}", i)
        elif op == "delta" and node.parent is not None and node.parent.cold is not None:
            t.set_cold(node, f"d{node.digest}", i, delta=True)
        elif op == "mark" and node.parent is not None:
            t.mark_non_cacheable(node)
        elif op == "tick":
            clock.t += i / 7
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tree"
        save_tree(t, path)
        first = path.read_bytes()
        loaded = load_tree(path, clock=clock)
        assert loaded.reason is None and loaded.nodes == len(t.nodes)
        loaded.tree.check()
        assert {n.digest: n.key for n in loaded.tree.nodes.values()} == {n.digest: n.key for n in t.nodes.values()}
        assert all(canonical(n.call) == n.key for n in loaded.tree.nodes.values() if n.call is not None)
        save_tree(loaded.tree, path)
        assert path.read_bytes() == first
