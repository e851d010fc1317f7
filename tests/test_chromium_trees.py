"""Chromium's accessibility tree against the text browser's, on every template of the web shop: one task of each
is walked along its reference solution in both browsers at once and, before every step and after the last, the
page's whole tree (the hidden tool ``_tree``) is read from both.

Checked: the element the next step targets (``@role 'name'``) is a line of Chromium's tree; both browsers are on
the same URL; and the two trees, as sets of (role, name) lines, differ by exactly the differences of
``DIFFERENCES`` (each explained in docs/suites.md, "Chromium's tree and the text browser's", which lists the same
keys): whatever no rule explains fails the test, and a rule that no page needed fails it too (the list is what the
browsers do, not what they might do).
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from bunshin.envs import ToolCall
from bunshin.envs.suites.base import SuiteTask, checked
from bunshin.envs.webshop import tasks as generator
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.envs.workspace import Workspace

from .test_chromium_shop import chromium_processes

DOCS = Path(__file__).resolve().parent.parent / "docs" / "suites.md"
DOC_SECTION = "### Chromium's tree and the text browser's"

Line = tuple[str, str]  # (role, name)

# key -> what differs and why; docs/suites.md has a row for each key. The rules that recognise them are RULES.
DIFFERENCES = {
    "list-marker": "Chromium prints a list item's bullet or number as `ListMarker '• '` / `ListMarker '3. '`; the "
                   "text browser prints a nameless `listitem` there",
    "nameless-structure": "Chromium prints nameless `form`, `main`, `time`, `group` (a fieldset, an `<address>`) "
                          "and `rowgroup` nodes; the text browser does not",
    "line-break": "Chromium prints a `<br>` as `LineBreak '\\n'`",
    "image-role": "an `<img>` is `image` in Chromium, `img` in the text browser (same name)",
    "edge-spaces": "Chromium keeps a text run's leading and trailing spaces (`StaticText 'Review by '`)",
    "legend-group": "a fieldset's legend names a `group` in Chromium; the text browser prints it as `StaticText`",
    "filled-textbox": "a text box with a value (typed by the reference, or the page's own: ``FORM_VALUES``) keeps "
                      "its label as its name in Chromium, its value a `StaticText` below it; in the text browser "
                      "the value is the box's name",
    "row-name": "Chromium's table rows are nameless; the text browser names a row by its cells' text (the cells "
                "themselves are compared)",
    "button-cell": "a table cell holding only a button (the cart's Remove) is a nameless `cell` in Chromium; the "
                   "text browser names it by the button's text",
}


@dataclass(frozen=True)
class Pair:
    """A text-browser line explained by a Chromium counterpart (``counterparts`` of its name), both taken out."""

    key: str
    text_role: str
    chromium_role: str
    counterparts: Callable[[str, dict[str, str]], set[str]]  # (text name, typed: label -> value) -> chromium names


@dataclass(frozen=True)
class Alone:
    """A line of one browser only (``side``), explained by its role and name alone."""

    key: str
    side: str  # "text" | "chromium"
    roles: frozenset[str]
    name: Callable[[str, dict[str, str]], bool]


def _same(name: str, typed: dict[str, str]) -> set[str]:
    return {name}


def _spaced(name: str, typed: dict[str, str]) -> set[str]:
    return {f"{name} ", f" {name}", f" {name} "}


def _label_of(value: str, typed: dict[str, str]) -> set[str]:
    return {label for label, typed_value in typed.items() if typed_value == value}


def _exactly(*names: str) -> Callable[[str, dict[str, str]], bool]:
    return lambda name, typed: name in names


def _matching(pattern: str) -> Callable[[str, dict[str, str]], bool]:
    return lambda name, typed: re.fullmatch(pattern, name) is not None


RULES: tuple[Pair | Alone, ...] = (
    Alone("list-marker", "text", frozenset({"listitem"}), _exactly("")),
    Alone("list-marker", "chromium", frozenset({"ListMarker"}), _matching(r"(•|\d+\.) ")),
    Alone("nameless-structure", "chromium", frozenset({"form", "main", "time", "group", "rowgroup"}), _exactly("")),
    Alone("line-break", "chromium", frozenset({"LineBreak"}), _exactly("\n")),
    Pair("image-role", "img", "image", _same),
    Pair("edge-spaces", "StaticText", "StaticText", _spaced),
    Pair("legend-group", "StaticText", "group", _same),
    Pair("filled-textbox", "textbox", "textbox", _label_of),
    Alone("filled-textbox", "chromium", frozenset({"StaticText"}), lambda name, typed: name in typed.values()),
    Alone("row-name", "text", frozenset({"row"}), _matching(r".+")),
    Alone("row-name", "chromium", frozenset({"row"}), _exactly("")),
    Alone("button-cell", "text", frozenset({"cell"}), _matching(r"Remove .+")),  # the cart's Remove button's cell
    Alone("button-cell", "chromium", frozenset({"cell"}), _exactly("")),
)

# The values the shop's forms come with (a text box the reference has not typed into but that has a value)
FORM_VALUES = {"Qty": "1"}  # the product page's quantity

_LINE = re.compile(r"\t*\[\d+\] (\S+) ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def lines(tree: str) -> set[Line]:
    """The (role, name) of every line of a ``_tree`` text."""
    found = set()
    for text in tree.splitlines():
        match = _LINE.match(text)
        assert match, f"not a tree line: {text!r}"
        found.add((match.group(1), ast.literal_eval(match.group(2))))
    return found


def unexplained(text: set[Line], chromium: set[Line], typed: dict[str, str],
                used: set[str]) -> tuple[set[Line], set[Line]]:
    """The lines of one browser's tree only that no rule of ``RULES`` explains (text's, Chromium's); the keys of
    the rules that explained some are added to ``used``."""
    text_only, chromium_only = text - chromium, chromium - text
    left_text, left_chromium = set(text_only), set(chromium_only)
    for rule in RULES:
        if isinstance(rule, Pair):
            for role, name in text_only:
                if role != rule.text_role:
                    continue
                matches = {(rule.chromium_role, n) for n in rule.counterparts(name, typed)} & chromium
                if matches:
                    left_text.discard((role, name))
                    left_chromium -= matches
                    used.add(rule.key)
        else:
            mine, left = (text_only, left_text) if rule.side == "text" else (chromium_only, left_chromium)
            for role, name in mine:
                if role in rule.roles and rule.name(name, typed) and (role, name) in left:
                    left.discard((role, name))
                    used.add(rule.key)
    return left_text, left_chromium


def target(call: ToolCall) -> Line | None:
    """The (role, name) a reference step names its element by (``@link 'My Account'``), if it does."""
    element = call.args.get("element_id")
    if not isinstance(element, str):
        return None
    role, _, quoted = element[1:].partition(" ")
    return role, ast.literal_eval(quoted)


@dataclass
class Walk:
    """What the two walks of one task found."""

    task: SuiteTask
    pages: int = 0
    missing: list[str] = field(default_factory=list)  # targets Chromium's tree did not have
    differences: list[str] = field(default_factory=list)  # lines no rule explains, by step
    urls: list[str] = field(default_factory=list)  # steps where the two browsers were on different pages


async def seen(ws: Workspace) -> tuple[str, set[Line]]:
    return (await checked(ws, "_url", {})).output, lines((await checked(ws, "_tree", {})).output)


async def walk(suites: dict[str, WebShopSuite], bases: dict[str, Workspace], task: SuiteTask,
               used: set[str]) -> Walk:
    found = Walk(task=task)
    spaces = {kind: await base.fork() for kind, base in bases.items()}
    typed = dict(FORM_VALUES)  # text box label -> its value: the page's own, or what the reference typed
    try:
        for kind, ws in spaces.items():
            await suites[kind].start(ws, task)
        for n, call in enumerate(task.reference):
            (text_url, text), (chromium_url, chromium) = [await seen(spaces[k]) for k in ("text", "chromium")]
            found.pages += 1
            if same_page(text_url) != same_page(chromium_url):
                found.urls.append(f"step {n}: text on {text_url}, Chromium on {chromium_url}")
            left_text, left_chromium = unexplained(text, chromium, typed, used)
            if left_text or left_chromium:
                found.differences.append(f"before step {n} ({chromium_url}): text only {sorted(left_text)}, "
                                         f"Chromium only {sorted(left_chromium)}")
            if suites["chromium"].is_final(call):
                break
            wanted = target(call)
            if wanted is not None and wanted not in chromium:
                found.missing.append(f"step {n} {call.name}: {wanted} on {chromium_url}")
                break  # the step cannot be played in Chromium
            for kind, ws in spaces.items():
                obs = await ws.execute(await suites[kind].concrete(ws, call))
                assert obs.error is None, f"task {task.id} step {n} in {kind}: {obs.error}"
            if call.name == "type" and wanted is not None:
                typed[wanted[1]] = str(call.args["text"])
    finally:
        for ws in spaces.values():
            await ws.close()
    return found


def same_page(url: str) -> str:
    """``url`` with an empty path spelled ``/`` (the text browser keeps a start URL's empty path, Chromium does not:
    one page)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path or "/"))


def documented_keys() -> set[str]:
    """The keys of the differences table in docs/suites.md's section on the two trees."""
    text = DOCS.read_text()
    assert DOC_SECTION in text, f"{DOCS} has no section {DOC_SECTION!r}"
    section = text.split(DOC_SECTION, 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([a-z-]+)` \|", section, flags=re.MULTILINE))


def test_the_documented_differences_are_the_tests() -> None:
    assert documented_keys() == set(DIFFERENCES) == {rule.key for rule in RULES}


def test_a_difference_no_rule_explains_is_left() -> None:
    """The rules explain their own differences only: a missing link, a renamed button, a `listitem` with a name
    and a textbox whose value nobody typed are all left."""
    text = {("link", "My Account"), ("listitem", ""), ("img", "A"), ("textbox", "Liam"), ("button", "Add to Cart"),
            ("listitem", "Shoes"), ("textbox", "Nobody typed this")}
    chromium = {("ListMarker", "• "), ("image", "A"), ("textbox", "First Name"), ("StaticText", "Liam"),
                ("button", "Add"), ("textbox", "Last Name")}
    used: set[str] = set()
    left = unexplained(text, chromium, {"First Name": "Liam"}, used)
    assert left == ({("link", "My Account"), ("button", "Add to Cart"), ("listitem", "Shoes"),
                     ("textbox", "Nobody typed this")}, {("button", "Add"), ("textbox", "Last Name")})
    assert used == {"list-marker", "image-role", "filled-textbox"}


@pytest.mark.asyncio(loop_factories=["uvloop"])  # the event loop does not matter here: one pass is enough
async def test_chromium_and_text_trees_on_every_template(runtime) -> None:
    suites = {kind: WebShopSuite(browser=kind, time_scale=0.0, screenshots=False) for kind in ("text", "chromium")}
    tasks: dict[str, SuiteTask] = {}
    for task in suites["text"].tasks():
        tasks.setdefault(task.template, task)
    assert set(tasks) == set(generator.TEMPLATES)
    bases = {kind: await runtime.create(suite.app()) for kind, suite in suites.items()}
    used: set[str] = set()
    gate = asyncio.Semaphore(2)

    async def one(task: SuiteTask) -> Walk:
        async with gate:
            return await walk(suites, bases, task, used)

    try:
        walks = await asyncio.gather(*(one(t) for t in tasks.values()))
    finally:
        for base in bases.values():
            await base.close()
    report = [f"task {w.task.id} ({w.task.template}) {what}" for w in walks
              for what in (*w.missing, *w.urls, *w.differences)]
    assert not report, "\n".join(report)
    assert all(w.pages == len(w.task.reference) for w in walks)  # every step's page was compared
    assert used == set(DIFFERENCES), f"listed but never seen: {sorted(set(DIFFERENCES) - used)}"
    await runtime.close()
    assert not chromium_processes(runtime.run_id)
