"""Every record that crosses the engine/workspace boundary round-trips through MessagePack and JSON."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.envs import records

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
args = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
tool_calls = st.builds(records.ToolCall, name=st.text(min_size=1, max_size=20), args=args)
observations = st.builds(records.Observation, output=st.text(max_size=50), exit_code=st.none() | st.integers(-255, 255),
                         error=st.none() | st.text(max_size=20), data=args,
                         tool_seconds=st.floats(0, 1e6, allow_nan=False))
sizes = st.integers(0, 2**62)
memory = st.builds(records.MemoryStats, pss=sizes, private=sizes, shared=sizes, rss=sizes, anon_huge=sizes,
                   cgroup_charge=sizes, processes=st.integers(0, 10_000))
clone_specs = st.builds(records.CloneSpec, ws_id=st.text(max_size=10), hostname=st.text(max_size=10),
                        seed=st.integers(0, 2**63 - 1), layer=st.text(max_size=10), cgroup_rel=st.text(max_size=10),
                        frozen=st.booleans())
requests = st.one_of(
    st.builds(records.Execute, call=tool_calls, timeout_s=st.floats(0, 1e4, allow_nan=False)),
    st.builds(records.Fork, clone=clone_specs),
    st.builds(records.Checkpoint, path=st.text(max_size=10), layer=st.text(max_size=10)),
    st.just(records.Ping()), st.just(records.Close()),
)
replies = st.one_of(
    st.builds(records.Ready, ws_id=st.text(max_size=10), pid=st.integers(1, 2**22), setup_s=st.floats(0, 1e3)),
    st.builds(records.Executed, observation=observations),
    st.builds(records.Forked, freeze_ns=st.integers(0, 2**62)),
    st.builds(records.Failed, kind=st.text(max_size=10), message=st.text(max_size=30)),
)


@settings(max_examples=200)
@given(st.one_of(tool_calls, observations, memory, clone_specs))
def test_structs_round_trip(value: msgspec.Struct) -> None:
    kind = type(value)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=kind) == value
    assert msgspec.json.decode(msgspec.json.encode(value), type=kind) == value


@settings(max_examples=200)
@given(requests)
def test_requests_round_trip_through_the_tagged_union(value: records.Request) -> None:
    assert records.request_decoder.decode(records.encoder.encode(value)) == value


@settings(max_examples=200)
@given(replies)
def test_replies_round_trip_through_the_tagged_union(value: records.Reply) -> None:
    assert records.reply_decoder.decode(records.encoder.encode(value)) == value


@given(st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), min_size=2, max_size=6))
def test_canonical_form_ignores_argument_order(d: dict[str, int]) -> None:
    forward = records.ToolCall(name="t", args=dict(sorted(d.items())))
    backward = records.ToolCall(name="t", args=dict(sorted(d.items(), reverse=True)))
    assert forward.canonical() == backward.canonical()


def test_memory_stats_add() -> None:
    a = records.MemoryStats(pss=1, private=2, processes=1)
    assert (a + a) == records.MemoryStats(pss=2, private=4, processes=2)


@pytest.mark.parametrize("text,expected", [("64M", 64 << 20), ("1G", 1 << 30), ("4096", 4096), ("1.5K", 1536),
                                           ("256MiB", 256 << 20)])
def test_sizes_parse(text: str, expected: int) -> None:
    from bunshin.engine.cli import nbytes_of

    assert nbytes_of(text) == expected
