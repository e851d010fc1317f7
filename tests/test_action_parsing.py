"""Hostile action text for both suites' parsers: any text is a call the schema accepts or an ``ActionError``, never
another exception, and quickly; the web shop's format/parse round trip over every tool of its schema; the known
cases (5,000 digits where an id goes, a 10 MB action, 100,000 nested JSON arrays, NaN, bools for ints); and, in real
workspaces, such actions on the engine's path (``suite.parse_action``) leave the workspace answering."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bunshin.envs.desktop import tools as desktop_tools
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import ActionError
from bunshin.envs.suites.tools import MAX_ACTION_CHARS, MAX_INT
from bunshin.envs.webshop import tools as webshop_tools
from bunshin.envs.webshop.browser.actions import format_action, parse_action, validate_call
from bunshin.envs.webshop.suite import WebShopSuite

WEBSHOP, DESKTOP = webshop_tools.SCHEMA, desktop_tools.SCHEMA


@pytest.fixture(scope="module")
def desktop() -> DesktopSuite:
    return DesktopSuite(cache_mb=8)


def parsed_or_refused(parse: Any, text: str) -> ToolCall | None:
    """``parse(text)``: a call, or ``None`` for an ``ActionError``; anything else fails the test."""
    started = time.perf_counter()
    try:
        return parse(text)
    except ActionError as exc:
        assert len(str(exc)) < 2000, "an error message echoes the whole action"
        return None
    finally:
        assert time.perf_counter() - started < 1.0, f"parsing {len(text)} characters took too long"


# -- the web shop ---------------------------------------------------------------------------------------------------

_pieces = st.sampled_from(["[", "]", "] [", "]\n[", " ", "0", "1", "12", "=", "press_enter_after=", "direction=",
                           "up", "DOWN", "-", "\n", "@link 'x'", "9" * 12, "é", "\x00"])
_chunk = st.one_of(_pieces, st.text(max_size=6))
WEB_TEXT = st.one_of(
    st.text(),
    st.builds(lambda verb, parts: verb + "".join(parts),
              st.sampled_from([*WEBSHOP.names, "CLICK", "Type", "stop", "fly", ""]), st.lists(_chunk, max_size=12)),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(WEB_TEXT)
def test_any_text_is_a_call_the_schema_accepts_or_an_action_error_webshop(text: str) -> None:
    call = parsed_or_refused(parse_action, text)
    if call is not None:
        assert WEBSHOP.normalize(call) == call  # accepted, and already in normal form
        assert parse_action(format_action(call)) == call


def _args(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Every valid argument value of a web shop tool, by the schema (no hand-written list of tools)."""
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for arg in WEBSHOP.args(name):
        t = arg.type
        if isinstance(t, mi.IntType):
            parts[arg.name] = st.integers(0, MAX_INT)
        elif isinstance(t, mi.BoolType):
            parts[arg.name] = st.booleans()
        elif isinstance(t, mi.LiteralType):
            parts[arg.name] = st.sampled_from(t.values)
        elif arg.trimmed:
            parts[arg.name] = st.text(st.characters(blacklist_categories=("Cs",))).map(str.strip).filter(bool)
        else:
            parts[arg.name] = st.text(st.characters(blacklist_categories=("Cs",)))
    return st.fixed_dictionaries(parts)


WEB_CALLS = st.one_of(*[_args(name).map(lambda a, n=name: ToolCall(name=n, args=a)) for name in WEBSHOP.names])


@settings(max_examples=800, deadline=None)
@given(WEB_CALLS)
def test_format_then_parse_round_trips_for_every_tool(call: ToolCall) -> None:
    assert validate_call(call) == call
    assert parse_action(format_action(call)) == call


@pytest.mark.parametrize("text, message", [
    ("hover [" + "9" * 5000 + "]", "at most 10 digits, got 5000 digits"),  # was a ValueError from int()
    ("hover [" + "9" * 5000, "square brackets"),
    ("type [" + "1" * 5000 + "] [x]", "at most 10 digits"),
    ("tab_focus [" + "0" * 11 + "]", "at most 10 digits"),
    ("click [9999999999]", f"element_id must be <= {MAX_INT}"),
    ("click [" + "١٢" + "]", "non-negative integer"),  # Arabic-Indic digits are digits, not ASCII
    ("goto [   ]", "non-empty [url]"),
    ("scroll [" + "x" * 100_000 + "]", f"the action is {len('scroll [') + 100_001} characters long"),
    ("stop [" + "a" * (10 << 20) + "]", f"at most {MAX_ACTION_CHARS} are accepted"),
    ("click [1] [2]" * 4000, "takes 1 argument(s), got 4001"),
])
def test_hostile_web_actions_are_action_errors(text: str, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ActionError) as info:
        parse_action(text)
    assert time.perf_counter() - started < 0.5
    assert message in str(info.value) and len(str(info.value)) < 1000


def test_long_but_allowed_web_actions_parse_quickly() -> None:
    answer = "a] [b" * ((MAX_ACTION_CHARS - 20) // 5)
    for text in (f"stop [{answer}]", f"type [7] [{answer}] [0]", "type [7] [" + "] [" * 20_000 + "]"):
        assert len(text) <= MAX_ACTION_CHARS
        started = time.perf_counter()
        call = parse_action(text)
        assert time.perf_counter() - started < 0.5 and validate_call(call) == call
    assert parse_action(f"type [7] [{answer}] [0]").args == {"element_id": 7, "text": answer,
                                                              "press_enter_after": False}


# -- the desktop ----------------------------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
_json_args = st.dictionaries(st.sampled_from(["command", "path", "line", "text", "start", "end", "seconds", "cell",
                                              "value", "query", "timeout_s", "count", "find", "replace", "x"]),
                             _json_values, max_size=4)
DESKTOP_TEXT = st.one_of(
    st.text(),
    st.builds(lambda name, args: json.dumps({"name": name, "args": args}),
              st.sampled_from([*DESKTOP.names, "_exec", "_read_file", "wait", ""]), _json_args),
    _json_values.map(json.dumps),
    st.builds(lambda verb, rest: f"{verb}:{rest}", st.sampled_from([*DESKTOP.names, "WAIT", "wait", "rm"]),
              st.text(max_size=12) | st.sampled_from([" nan", " inf", " -1", " 1e999", " 2", " 0x10"])),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DESKTOP_TEXT)
def test_any_text_is_a_call_the_schema_accepts_or_an_action_error_desktop(desktop: DesktopSuite, text: str) -> None:
    call = parsed_or_refused(desktop.parse_action, text)
    if call is not None:
        DESKTOP.decode(call)
        assert not call.name.startswith("_")
        assert desktop.normalize(desktop.normalize(call)) == desktop.normalize(call)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("text, message", [
    (_nested(100_000), "the action is 200000 characters long"),  # refused unread
    ('{"name": "terminal", "args": ' + _nested(100_000) + "}", "characters long"),
    # nested as deep as the length allows (a JSON parser recursing through it would hit Python's recursion limit)
    (_nested(32_000), "unknown action"),
    ('{"name": "terminal", "args": ' + _nested(32_000) + "}", "plain values"),
    ('{"name": "terminal", "args": {"command": ' + _nested(32_000) + "}}", "plain values"),
    ('{"x": ' + _nested(32_000) + ', "name": "DONE"}', "plain values"),
    ('{"name": "terminal", "args": {"command": ' + '{"a": ' * 8_000 + "1" + "}" * 8_000 + "}}", "plain values"),
    ('{"name": "terminal", "args": {"command": ["ls"]}}', "terminal: command must be str, got ['ls']"),
    ('{"name": "editor_insert", "args": {"line": true, "text": "x"}}', "line must be int >= 1, got True"),
    ('{"name": "editor_insert", "args": {"line": 2.0, "text": "x"}}', "line must be int >= 1, got 2.0"),
    ('{"name": "editor_insert", "args": {"line": ' + "9" * 5000 + ', "text": "x"}}', "Integer value out of range"),
    ('{"name": "WAIT", "args": {"seconds": NaN}}', "not valid JSON"),
    ('{"name": "WAIT", "args": {"seconds": Infinity}}', "not valid JSON"),
    ('{"name": "WAIT", "args": {"seconds": 1e400}}', "Number out of range"),
    ("WAIT: nan", "WAIT: seconds must be a number in [0, 30], got nan"),
    ("WAIT: -inf", "WAIT: seconds must be in [0, 30], got -inf"),
    ('{"name": "sheet_set", "args": {"cell": "A1", "value": {"a": 1}}}', "value must be str or int or a number"),
    ('{"name": "' + "x" * 60_000 + '"}', "unknown tool 'xxxx"),
    ("terminal: " + "x" * (10 << 20), f"at most {MAX_ACTION_CHARS} are accepted"),
    ('{"name": "_put_file", "args": {"path": "/etc/passwd", "content": "x"}}', "unknown tool '_put_file'"),
])
def test_hostile_desktop_actions_are_action_errors(desktop: DesktopSuite, text: str, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ActionError) as info:
        desktop.parse_action(text)
    assert time.perf_counter() - started < 0.5
    assert message in str(info.value) and len(str(info.value)) < 1000


def test_long_but_allowed_desktop_actions_parse(desktop: DesktopSuite) -> None:
    command = "echo " + "x" * (MAX_ACTION_CHARS - 20)
    assert desktop.parse_action(f"terminal: {command}") == ToolCall(name="terminal", args={"command": command})
    text = json.dumps({"name": "editor_insert", "args": {"line": 1, "text": "y" * (MAX_ACTION_CHARS - 80)}})
    assert desktop.parse_action(text).args["line"] == 1


# -- end to end: the engine's path, in real workspaces -----------------------------------------------------------------

HOSTILE_WEB = ["hover [" + "9" * 5000 + "]", "stop [" + "a" * (10 << 20) + "]", "click [" + "1" * 11 + "]",
               "type [7] " + "[" * 100_000]
HOSTILE_DESKTOP = [_nested(100_000), '{"name": "terminal", "args": ' + _nested(32_000) + "}",
                   "terminal: " + "x" * (10 << 20), '{"name": "_read_file", "args": {"path": "/var/lib/desktop"}}',
                   '{"name": "WAIT", "args": {"seconds": NaN}}']


@pytest.mark.asyncio
async def test_hostile_web_actions_leave_the_shop_answering(runtime, tmp_path) -> None:
    from bunshin.envs.webshop import tasks as generator

    tasks = await asyncio.to_thread(generator.generate, 2000, 0)  # a second of work: off the event loop
    generator.write(tmp_path, [t for t in tasks if t["bunshin_template"] == "review_count"][:1])
    suite = WebShopSuite(catalog_size=2000, tasks_dir=tmp_path, time_scale=0.0)
    [task] = suite.tasks()
    ws = await runtime.create(suite.app(task))
    first = await suite.start(ws, task)
    for text in HOSTILE_WEB:
        with pytest.raises(ActionError):
            suite.parse_action(text)  # what the engine does with a decision's text
    again = await ws.execute(ToolCall(name="observe"))
    assert again.error is None and again.output == first.output
    obs = await ws.execute(ToolCall(name="hover", args={"element_id": 2**40}))  # a call sent as a ToolCall
    assert obs.error and "element_id must be <=" in obs.error
    obs = await ws.execute(suite.parse_action("scroll [down]"))
    assert obs.error is None


@pytest.mark.asyncio
async def test_hostile_desktop_actions_leave_the_desktop_answering(runtime) -> None:
    suite = DesktopSuite(cache_mb=8, index_roots=["/usr/lib/python3.11/json"], recording_frames=2, time_scale=0.0)
    ws = await runtime.create(suite.app())
    for text in HOSTILE_DESKTOP:
        with pytest.raises(ActionError):
            suite.parse_action(text)
    obs = await ws.execute(ToolCall(name="WAIT", args={"seconds": float("nan")}))  # a call sent as a ToolCall
    assert obs.error and "WAIT: seconds must be a number in [0, 30], got nan" in obs.error
    obs = await ws.execute(suite.parse_action("terminal: echo still-here"))
    assert obs.error is None and obs.output == "still-here\n"
