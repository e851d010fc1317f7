"""WebArena's action language (``actions.py``): parsing every verb, the errors naming the action, validating tool
calls, and format/parse round trips. Moved unchanged from test_browser.py (actions.py and these tests belong to
its rework)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import ActionError
from bunshin.envs.webshop.browser.actions import format_action, parse_action, validate_call

# -- the action language -------------------------------------------------------------------------------------------

EXAMPLES = {
    "click [12]": ToolCall(name="click", args={"element_id": 12}),
    "hover [3]": ToolCall(name="hover", args={"element_id": 3}),
    "type [7] [sony headphones] [1]": ToolCall(name="type", args={"element_id": 7, "text": "sony headphones",
                                                                  "press_enter_after": True}),
    "type [7] [sony headphones]": ToolCall(name="type", args={"element_id": 7, "text": "sony headphones",
                                                              "press_enter_after": True}),
    "type [7] [a] [b] [0]": ToolCall(name="type", args={"element_id": 7, "text": "a] [b", "press_enter_after": False}),
    "type [7] [x] [press_enter_after=0]": ToolCall(name="type", args={"element_id": 7, "text": "x",
                                                                      "press_enter_after": False}),
    "press [Control+a]": ToolCall(name="press", args={"key_comb": "Control+a"}),
    "scroll [down]": ToolCall(name="scroll", args={"direction": "down"}),
    "scroll [direction=up]": ToolCall(name="scroll", args={"direction": "up"}),
    "new_tab": ToolCall(name="new_tab"),
    "tab_focus [2]": ToolCall(name="tab_focus", args={"tab_index": 2}),
    "close_tab": ToolCall(name="close_tab"),
    "goto [http://127.0.0.1:7770/x.html?q=[1]]": ToolCall(name="goto",
                                                         args={"url": "http://127.0.0.1:7770/x.html?q=[1]"}),
    "go_back": ToolCall(name="go_back"),
    "go_forward": ToolCall(name="go_forward"),
    "stop [$12.99]": ToolCall(name="stop", args={"answer": "$12.99"}),
    "stop []": ToolCall(name="stop", args={"answer": ""}),
    "stop": ToolCall(name="stop", args={"answer": ""}),
    "  CLICK[5]  ": ToolCall(name="click", args={"element_id": 5}),
}


@pytest.mark.parametrize("text", list(EXAMPLES))
def test_parse_every_verb(text: str) -> None:
    call = parse_action(text)
    assert call == EXAMPLES[text]
    assert parse_action(format_action(call)) == call and validate_call(call) == call


@pytest.mark.parametrize("text, message", [
    ("clik [1]", "unknown action 'clik'"),
    ("", "empty"),
    ("click", r"click needs \[element_id\]"),
    ("click [x]", "must be a non-negative integer"),
    ("click [-3]", "must be a non-negative integer"),
    ("click [1] [2]", "takes 1 argument"),
    ("click 12", "square brackets"),
    ("type [3]", "type needs"),
    ("type [a] [b]", "non-negative integer"),
    ("scroll [left]", "up or down"),
    ("tab_focus [one]", "non-negative integer"),
    ("goto []", "non-empty"),
    ("press", "press needs"),
    ("new_tab [1]", "takes 0 argument"),
])
def test_parse_errors_name_the_action(text: str, message: str) -> None:
    with pytest.raises(ActionError, match=message) as info:
        parse_action(text)
    assert repr(text.strip()) in str(info.value) or text == ""


@pytest.mark.parametrize("call, message", [
    (ToolCall(name="jump", args={}), "unknown tool 'jump'"),
    (ToolCall(name="click", args={}), "missing"),
    (ToolCall(name="click", args={"element_id": 1, "x": 2}), "unexpected"),
    (ToolCall(name="click", args={"element_id": True}), "non-negative int"),
    (ToolCall(name="type", args={"element_id": 1, "text": 5}), "text must be str"),
    (ToolCall(name="scroll", args={"direction": "left"}), "up' or 'down"),
    (ToolCall(name="goto", args={"url": " /x"}), "surrounding whitespace"),
])
def test_validate_call_errors(call: ToolCall, message: str) -> None:
    with pytest.raises(ActionError, match=message):
        validate_call(call)
    assert validate_call(ToolCall(name="type", args={"element_id": 1, "text": "x"})).args["press_enter_after"] is True


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_stripped = _text.map(str.strip).filter(bool)
CALLS = st.one_of(
    st.builds(lambda n, i: ToolCall(name=n, args={"element_id": i}), st.sampled_from(["click", "hover"]),
              st.integers(0, 10**9)),
    st.builds(lambda i, t, p: ToolCall(name="type", args={"element_id": i, "text": t, "press_enter_after": p}),
              st.integers(0, 10**6), _text, st.booleans()),
    st.builds(lambda k: ToolCall(name="press", args={"key_comb": k}), _stripped),
    st.builds(lambda d: ToolCall(name="scroll", args={"direction": d}), st.sampled_from(["up", "down"])),
    st.builds(lambda i: ToolCall(name="tab_focus", args={"tab_index": i}), st.integers(0, 100)),
    st.builds(lambda u: ToolCall(name="goto", args={"url": u}), _stripped),
    st.builds(lambda a: ToolCall(name="stop", args={"answer": a}), _text),
    st.sampled_from([ToolCall(name=n) for n in ("new_tab", "close_tab", "go_back", "go_forward")]),
)


@settings(max_examples=300, deadline=None)
@given(CALLS)
def test_format_then_parse_round_trips(call: ToolCall) -> None:
    assert parse_action(format_action(call)) == call
