"""The suites' tool schemas (``envs/suites/tools.py``, ``envs/webshop/tools.py``, ``envs/desktop/tools.py``): exactly
the tools the applications have, checks that name the tool and the argument, one normal form per call (and so one
``canonical`` key), OpenAI function definitions that are self-contained, and the prompt listings generated from
them. No workspace is needed."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.envs.desktop import tools as desktop_tools
from bunshin.envs.desktop.app import DesktopApp
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.records import AppSpec, Observation, ToolCall, canonical
from bunshin.envs.suites import registry
from bunshin.envs.suites.base import ActionError, Suite, SuiteTask
from bunshin.envs.suites.tools import MAX_INT, ToolArgs, ToolSchema, Trimmed
from bunshin.envs.webshop import tools as webshop_tools
from bunshin.envs.webshop.app import ShopApp
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.openai import DEFAULT_PROMPTS, suite_tools

WEBSHOP, DESKTOP = webshop_tools.SCHEMA, desktop_tools.SCHEMA
SCHEMAS = {"webshop": WEBSHOP, "desktop": DESKTOP}


def C(name: str, **args: Any) -> ToolCall:
    return ToolCall(name=name, args=args)


@pytest.fixture(scope="module")
def desktop() -> DesktopSuite:
    return DesktopSuite(cache_mb=8)


@pytest.fixture(scope="module")
def webshop() -> WebShopSuite:
    return WebShopSuite(catalog_size=2000)


# -- which tools ----------------------------------------------------------------------------------------------------


def test_the_schemas_hold_exactly_the_agent_tools_of_the_applications() -> None:
    assert WEBSHOP.names == ("click", "hover", "type", "press", "scroll", "new_tab", "tab_focus", "close_tab", "goto",
                             "go_back", "go_forward", "stop")
    assert {n: [a.name for a in WEBSHOP.args(n)] for n in ("click", "type", "press", "scroll", "tab_focus", "goto",
                                                           "stop")} == {
        "click": ["element_id"], "type": ["element_id", "text", "press_enter_after"], "press": ["key_comb"],
        "scroll": ["direction"], "tab_focus": ["tab_index"], "goto": ["url"], "stop": ["answer"]}
    shop_tools = set(ShopApp().tools())
    assert {n for n in shop_tools if not n.startswith("_")} - {"observe"} == set(WEBSHOP.names) - {"stop"}
    desktop_app_tools = set(DesktopApp(cache_mb=8).tools())
    assert {n for n in desktop_app_tools if not n.startswith("_")} == set(DESKTOP.names) - desktop_tools.FINAL
    for schema in SCHEMAS.values():  # internal tools are not the agent's
        assert not any(n.startswith("_") for n in schema.names)
    with pytest.raises(ValueError, match="internal tools"):
        ToolSchema({"_exec": desktop_tools.TerminalArgs})


def test_defaults_and_ranges_are_today_s() -> None:
    assert WEBSHOP.normalize(C("type", element_id=3, text="x")).args["press_enter_after"] is True
    assert WEBSHOP.normalize(C("stop")).args == {"answer": ""}
    assert DESKTOP.normalize(C("terminal", command="ls")).args == {"command": "ls", "timeout_s": 30.0}
    assert DESKTOP.normalize(C("WAIT")).args == {"seconds": 1.0}
    for ok in (0.001, 300, 300.0):
        assert DESKTOP.normalize(C("terminal", command="ls", timeout_s=ok)).args["timeout_s"] == float(ok)
    for bad in (0, -1, 300.5, math.inf, math.nan):
        with pytest.raises(ActionError, match=r"terminal: timeout_s must be (a number )?in \(0, 300\]"):
            DESKTOP.decode(C("terminal", command="ls", timeout_s=bad))
    for ok in (0, 30, 2.5):
        DESKTOP.decode(C("WAIT", seconds=ok))
    for bad in (-0.1, 31, math.nan):
        with pytest.raises(ActionError, match=r"WAIT: seconds must be (a number )?in \[0, 30\]"):
            DESKTOP.decode(C("WAIT", seconds=bad))


# -- checks ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schema, call, message", [
    (WEBSHOP, C("jump"), "unknown tool 'jump'"),
    (WEBSHOP, C("click"), "click: missing argument 'element_id'; click takes element_id: int >= 0"),
    (WEBSHOP, C("click", element_id=1, x=2), "click: unexpected argument 'x'"),
    (WEBSHOP, C("click", element_id=True), "click: element_id must be non-negative int, got True"),
    (WEBSHOP, C("click", element_id=1.0), "click: element_id must be non-negative int, got 1.0"),
    (WEBSHOP, C("click", element_id=-1), "click: element_id must be >= 0, got -1"),
    (WEBSHOP, C("click", element_id=10**40), f"click: element_id must be <= {MAX_INT}"),
    (WEBSHOP, C("type", element_id=1, text=5), "type: text must be str, got 5"),
    (WEBSHOP, C("type", element_id=1, text="x", press_enter_after=1), "press_enter_after must be bool, got 1"),
    (WEBSHOP, C("scroll", direction="left"), "scroll: direction must be 'up' or 'down', got 'left'"),
    (WEBSHOP, C("goto", url=" /x"), "goto: url must be non-empty with no surrounding whitespace, got ' /x'"),
    (WEBSHOP, C("press", key_comb=""), "press: key_comb must be non-empty with no surrounding whitespace"),
    (DESKTOP, C("_read_file", path="/var/lib/desktop/x"), "unknown tool '_read_file'"),
    (DESKTOP, C("terminal"), "terminal: missing argument 'command'"),
    (DESKTOP, C("terminal", command=["ls"]), "terminal: command must be str, got ['ls']"),
    (DESKTOP, C("editor_insert", line=True, text="x"), "editor_insert: line must be int >= 1, got True"),
    (DESKTOP, C("editor_insert", line=0, text="x"), "editor_insert: line must be >= 1, got 0"),
    (DESKTOP, C("editor_replace", find="a", replace="b", count=0), "editor_replace: count must be >= 1, got 0"),
    (DESKTOP, C("editor_replace", find="", replace="b"), "editor_replace: find must be non-empty, got ''"),
    (DESKTOP, C("sheet_set", cell="A1", value=math.inf), "sheet_set: value must be a finite number, got inf"),
    (DESKTOP, C("sheet_set", cell="A1", value=math.nan), "sheet_set: value must be a finite number, got nan"),
    (DESKTOP, C("sheet_set", cell="A1", value=None), "sheet_set: value must be str or int or a number, got None"),
    (DESKTOP, C("search_files", query="a\nb"), "search_files: query must be a non-empty single line"),
    (DESKTOP, ToolCall(name="DONE", args=[1]), "DONE takes an object of arguments, got array"),  # type: ignore[arg-type]
    (DESKTOP, ToolCall(name="DONE", args={1: 2}), "DONE: argument names must be strings"),
    (DESKTOP, C("editor_open", **{"x" * 10_000: 1}), "editor_open: unexpected argument 'xxxx"),
])
def test_a_call_that_does_not_fit_is_an_action_error_naming_tool_and_argument(schema: ToolSchema, call: ToolCall,
                                                                              message: str) -> None:
    with pytest.raises(ActionError) as info:
        schema.decode(call)
    assert message in str(info.value)
    assert len(str(info.value)) < 1000  # a huge argument is not echoed whole


def test_to_call_checks_a_struct_built_in_python() -> None:
    assert WEBSHOP.to_call(webshop_tools.ClickArgs(element_id=3)) == C("click", element_id=3)
    assert DESKTOP.to_call(desktop_tools.EditorDeleteLinesArgs(start=4)) == C("editor_delete_lines", start=4, end=4,
                                                                              path=None)
    with pytest.raises(ActionError, match="url must be non-empty"):
        WEBSHOP.to_call(webshop_tools.GotoArgs(url=" x "))
    with pytest.raises(ActionError, match="element_id must be non-negative int"):
        WEBSHOP.to_call(webshop_tools.ClickArgs(element_id="7"))  # msgspec does not type-check __init__
    with pytest.raises(ActionError, match="not a tool of this schema"):
        DESKTOP.to_call(webshop_tools.ClickArgs(element_id=3))


# -- one normal form, one key ---------------------------------------------------------------------------------------


SAME = [
    (WEBSHOP, C("type", text="x", element_id=3), C("type", element_id=3, text="x", press_enter_after=True)),
    (WEBSHOP, C("stop"), C("stop", answer="")),
    (DESKTOP, C("terminal", command="ls"), C("terminal", timeout_s=30, command="ls")),
    (DESKTOP, C("terminal", command="ls", timeout_s=5), C("terminal", command="ls", timeout_s=5.0)),
    (DESKTOP, C("WAIT", seconds=2), C("WAIT", seconds=2.0)),
    (DESKTOP, C("WAIT"), C("WAIT", seconds=1)),
    (DESKTOP, C("editor_delete_lines", start=3), C("editor_delete_lines", end=3, start=3, path=None)),
    (DESKTOP, C("sheet_set", value="=A1", cell="B2"), C("sheet_set", cell="B2", value="=A1", path=None)),
    (DESKTOP, C("editor_replace", find="a", replace="b"), C("editor_replace", replace="b", find="a", count=None)),
]
DIFFERENT = [
    (WEBSHOP, C("type", element_id=3, text="x"), C("type", element_id=3, text="x", press_enter_after=False)),
    (WEBSHOP, C("click", element_id=3), C("hover", element_id=3)),
    (WEBSHOP, C("click", element_id=3), C("click", element_id=4)),
    (WEBSHOP, C("stop"), C("stop", answer=" ")),
    (DESKTOP, C("terminal", command="ls"), C("terminal", command="ls", timeout_s=30.5)),
    (DESKTOP, C("terminal", command="ls"), C("terminal", command="ls ")),
    (DESKTOP, C("editor_delete_lines", start=3), C("editor_delete_lines", start=3, end=4)),
    (DESKTOP, C("sheet_set", cell="A1", value="1"), C("sheet_set", cell="A1", value=1)),  # text is not a number
    (DESKTOP, C("sheet_set", cell="A1", value=1), C("sheet_set", cell="A1", value=1.5)),
    (DESKTOP, C("editor_save"), C("editor_save", path="~/x.txt")),
]


@pytest.mark.parametrize("schema, a, b", SAME)
def test_spellings_of_one_call_share_one_canonical_key(schema: ToolSchema, a: ToolCall, b: ToolCall,
                                                       webshop: WebShopSuite, desktop: DesktopSuite) -> None:
    suite = webshop if schema is WEBSHOP else desktop
    assert canonical(a) != canonical(b)  # as written they differ...
    assert canonical(suite.normalize(a)) == canonical(suite.normalize(b))  # ...normalised they are one call
    assert suite.normalize(suite.normalize(a)) == suite.normalize(a)


@pytest.mark.parametrize("schema, a, b", DIFFERENT)
def test_different_calls_keep_different_keys(schema: ToolSchema, a: ToolCall, b: ToolCall, webshop: WebShopSuite,
                                             desktop: DesktopSuite) -> None:
    suite = webshop if schema is WEBSHOP else desktop
    assert canonical(suite.normalize(a)) != canonical(suite.normalize(b))


def test_normalize_keeps_a_reference_step_s_symbolic_element(webshop: WebShopSuite) -> None:
    step = C("type", element_id="@textbox 'Qty'", text="2")
    assert webshop.normalize(step) == C("type", element_id="@textbox 'Qty'", text="2", press_enter_after=True)
    with pytest.raises(ActionError, match="element_id"):
        webshop.normalize(C("click", element_id="12"))  # a string that is no element reference
    for task in webshop.tasks()[:20]:  # reference steps are written in normal form
        assert all(webshop.normalize(c) == c for c in task.reference)


def test_the_base_suite_s_normalize_is_the_identity() -> None:
    class Plain(Suite):
        name = "plain"

        def tasks(self) -> list[SuiteTask]:
            return []

        def app(self, task: SuiteTask | None = None) -> AppSpec:
            return AppSpec()

        async def start(self, ws: Any, task: SuiteTask) -> Observation:
            return Observation()

        def parse_action(self, text: str) -> ToolCall:
            return C(text)

        def is_final(self, call: ToolCall) -> bool:
            return True

        def null_action(self) -> ToolCall:
            return C("stop")

        async def evaluate(self, ws: Any, task: SuiteTask, final: ToolCall) -> float:
            return 0.0

    call = C("anything", x=1)
    assert Plain().normalize(call) is call


def _value(schema: ToolSchema, name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Valid arguments for ``name``, some with defaults left out, ints where floats are declared."""
    parts: dict[str, st.SearchStrategy[Any]] = {}
    optional = []
    for arg in schema.args(name):
        t = arg.type
        members = [m for m in (t.types if isinstance(t, mi.UnionType) else (t,)) if not isinstance(m, mi.NoneType)]
        m = members[0]
        if isinstance(m, mi.IntType):
            s: st.SearchStrategy[Any] = st.integers(m.ge or 0, 1000)
        elif isinstance(m, mi.FloatType):
            low, high = (m.ge if m.ge is not None else m.gt + 0.001), m.le
            s = st.one_of(st.integers(math.ceil(low), math.floor(high)), st.floats(low, high))
        elif isinstance(m, mi.BoolType):
            s = st.booleans()
        elif isinstance(m, mi.LiteralType):
            s = st.sampled_from(m.values)
        else:
            s = st.text(max_size=10).map(lambda x: "x" + x.strip().replace("\n", " ") + "x")
        parts[arg.name] = s
        if not arg.required:
            optional.append(arg.name)
    return st.fixed_dictionaries(parts).flatmap(
        lambda full: st.sets(st.sampled_from(optional) if optional else st.nothing()).map(
            lambda dropped: {k: v for k, v in full.items() if k not in dropped}))


CALLS = st.one_of(*[st.tuples(st.just(schema), st.just(name), _value(schema, name))
                    for schema in SCHEMAS.values() for name in schema.names])


@settings(max_examples=400, deadline=None)
@given(CALLS, st.randoms())
def test_normal_form_is_order_and_default_blind_and_idempotent(case: tuple[ToolSchema, str, dict[str, Any]],
                                                               rnd: Any) -> None:
    schema, name, args = case
    call = C(name, **args)
    normal = schema.normalize(call)
    shuffled = list(args.items())
    rnd.shuffle(shuffled)
    assert canonical(schema.normalize(ToolCall(name=name, args=dict(shuffled)))) == canonical(normal)
    assert schema.normalize(normal) == normal and schema.decode(normal) == schema.decode(call)
    assert set(normal.args) == {a.name for a in schema.args(name)}  # every default written out
    assert schema.to_call(schema.decode(call)) == normal


# -- what a model sees ----------------------------------------------------------------------------------------------


def _keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


@pytest.mark.parametrize("suite", sorted(SCHEMAS))
def test_openai_functions_are_generated_self_contained(suite: str) -> None:
    schema = SCHEMAS[suite]
    tools = suite_tools(suite)
    assert registry.tool_schema(suite) is schema and registry.suite_class(suite).tool_schema is schema
    assert [t["function"]["name"] for t in tools] == list(schema.names)
    for tool in tools:
        fn = tool["function"]
        assert tool["type"] == "function" and set(fn) == {"name", "description", "parameters"}
        assert fn["description"] == schema.description(fn["name"]) and fn["description"]
        params = fn["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert not _keys(params) & {"$ref", "$defs", "title"}
        assert list(params["properties"]) == [a.name for a in schema.args(fn["name"])]
        assert params["required"] == [a.name for a in schema.args(fn["name"]) if a.required]
        json.dumps(tool)  # plain JSON
    tools[0]["function"]["name"] = "changed"
    assert suite_tools(suite)[0]["function"]["name"] == schema.names[0]  # callers get copies
    click = {t["function"]["name"]: t for t in suite_tools("webshop")}["click"]["function"]["parameters"]
    assert click["properties"]["element_id"]["type"] == "integer" and click["properties"]["element_id"]["minimum"] == 0


def test_a_property_named_title_is_kept() -> None:
    class TitledArgs(ToolArgs, kw_only=True):
        """Set the title."""

        title: Annotated[str, msgspec.Meta(description="The new title.")]
        subtitle: Trimmed | None = None

    [tool] = ToolSchema({"set_title": TitledArgs}).openai_tools()
    assert tool["function"]["parameters"]["properties"]["title"] == {"description": "The new title.",
                                                                     "type": "string"}


@pytest.mark.parametrize("suite", sorted(SCHEMAS))
def test_the_prompt_lists_every_tool_from_the_schema(suite: str) -> None:
    schema, prompt = SCHEMAS[suite], DEFAULT_PROMPTS[suite]
    for name in schema.names:
        line = next(line for line in prompt.splitlines() if line.strip().startswith(f"{name}("))
        assert schema.signature(name) in line or not schema.args(name)
        assert schema.description(name).split("\n\n")[0] in line
    assert schema.listing() in prompt


def test_suites_declare_their_schema_and_knobs_and_policies_find_it_in_the_registry() -> None:
    """``Suite.tool_schema`` and ``Suite.knobs`` are part of the contract, with defaults (none); ``suite_tools``
    reads the registry's, and names a suite it cannot offer."""
    from bunshin.policies.base import PolicyError

    assert Suite.tool_schema is None and Suite.knobs == {}
    assert WebShopSuite.tool_schema is WEBSHOP and DesktopSuite.tool_schema is DESKTOP
    assert WebShopSuite(catalog_size=500, time_scale=0.0).knobs["catalog_size"] == 500
    with pytest.raises(PolicyError, match="no tool schema for suite 'nonesuch'.*known: desktop, osworld, webarena, webshop"):
        suite_tools("nonesuch")

