"""Every record that crosses the engine/workspace boundary round-trips through MessagePack and JSON; a tool call has
one canonical form."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.envs import records
from bunshin.envs.runtime import protocol

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
clone_specs = st.builds(protocol.CloneSpec, ws_id=st.text(max_size=10), hostname=st.text(max_size=10),
                        seed=st.integers(0, 2**63 - 1), layer=st.text(max_size=10), cgroup_rel=st.text(max_size=10),
                        frozen=st.booleans())
requests = st.one_of(
    st.builds(protocol.Execute, call=tool_calls, timeout_s=st.floats(0, 1e4, allow_nan=False)),
    st.builds(protocol.Fork, clone=clone_specs),
    st.builds(protocol.Checkpoint, path=st.text(max_size=10), layer=st.text(max_size=10)),
    st.just(protocol.Ping()), st.just(protocol.Close()),
)
replies = st.one_of(
    st.builds(protocol.Ready, ws_id=st.text(max_size=10), pid=st.integers(1, 2**22), setup_s=st.floats(0, 1e3)),
    st.builds(protocol.Executed, observation=observations),
    st.builds(protocol.Forked, freeze_ns=st.integers(0, 2**62)),
    st.builds(protocol.Failed, kind=st.text(max_size=10), message=st.text(max_size=30)),
)


@settings(max_examples=200)
@given(st.one_of(tool_calls, observations, memory, clone_specs))
def test_structs_round_trip(value: msgspec.Struct) -> None:
    kind = type(value)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=kind) == value
    assert msgspec.json.decode(msgspec.json.encode(value), type=kind) == value


@settings(max_examples=200)
@given(requests)
def test_requests_round_trip_through_the_tagged_union(value: protocol.Request) -> None:
    assert protocol.request_decoder.decode(protocol.encoder.encode(value)) == value


@settings(max_examples=200)
@given(replies)
def test_replies_round_trip_through_the_tagged_union(value: protocol.Reply) -> None:
    assert protocol.reply_decoder.decode(protocol.encoder.encode(value)) == value


@given(st.dictionaries(st.text(max_size=5), json_values, min_size=2, max_size=6))
def test_canonical_form_ignores_argument_order_and_nothing_else(d: dict[str, object]) -> None:
    forward = records.ToolCall(name="t", args=dict(sorted(d.items())))
    backward = records.ToolCall(name="t", args=dict(sorted(d.items(), reverse=True)))
    assert records.canonical(forward) == records.canonical(backward)
    key = next(iter(d))
    changed = records.ToolCall(name="t", args={**d, key: ["a value no strategy draws", d[key]]})
    assert records.canonical(changed) != records.canonical(forward)
    assert records.canonical(records.ToolCall(name="u", args=d)) != records.canonical(forward)


def test_canonical_form_is_compact_sorted_json_and_there_is_one() -> None:
    from bunshin.engine import records as engine_records

    call = records.ToolCall(name="type", args={"text": "a b", "element_id": 7, "press_enter_after": True})
    assert records.canonical(call) == b'{"args":{"element_id":7,"press_enter_after":true,"text":"a b"},"name":"type"}'
    assert engine_records.canonical is records.canonical  # the engine keys by the same function
    assert not hasattr(records.ToolCall, "canonical")
    # an int and a bool (or a float) are different arguments: a tool schema normalises types before keying
    assert records.canonical(records.ToolCall(name="t", args={"x": 1})) != \
        records.canonical(records.ToolCall(name="t", args={"x": True}))
    assert records.canonical(records.ToolCall(name="t", args={"x": 1})) != \
        records.canonical(records.ToolCall(name="t", args={"x": 1.0}))


def test_memory_stats_add() -> None:
    a = records.MemoryStats(pss=1, private=2, processes=1)
    assert (a + a) == records.MemoryStats(pss=2, private=4, processes=2)


@pytest.mark.parametrize("text,expected", [("64M", 64 << 20), ("1G", 1 << 30), ("4096", 4096), ("1.5K", 1536),
                                           ("256MiB", 256 << 20)])
def test_sizes_parse(text: str, expected: int) -> None:
    from bunshin.engine.cli import nbytes_of

    assert nbytes_of(text) == expected
