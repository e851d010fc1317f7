"""The web shop reader's eyes: WebArena's text observation, and what one visit to a page has shown.

Owns: parsing one observation (``[id] role 'name' props`` lines under a ``RootWebArea``, the notes on lines hidden
above and below) into a ``View``; merging the views of one visit to a page (the observations since the last action
that could navigate, a scroll or a detour among them) into a ``Page`` that knows which of its lines have been seen;
``Page.seek``: an element the visit has shown, or the scroll that shows more of the page, or None when the whole
page has been seen without it. Element ids belong to the page state, so an id seen earlier in the same visit is as
good as one in the current viewport (a model keeps earlier observations in its context too).
Must never: read anything but the observation texts and the action texts that separate them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_LINE = re.compile(r"""^(\t*)\[(\d+)\] (\S+) ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(.*)$""")
_ABOVE = re.compile(r"^\t\(\.\.\. (\d+) lines above;")
_BELOW = re.compile(r"^\t\(\.\.\. (\d+) lines below;")
# Actions that stay on the page they were taken on: scrolling, hovering, typing without pressing Enter.
_STAYS = re.compile(r"^(?:scroll|hover) \[|^type \[\d+\] \[.*\] \[(?:0|press_enter_after=0)\]$", re.DOTALL)
_TYPED = re.compile(r"^type \[(\d+)\] \[(.*)\] \[(?:0|1|press_enter_after=[01])\]$", re.DOTALL)
MONEY = re.compile(r"\$\d[\d,]*\.\d\d")


@dataclass(frozen=True)
class Node:
    id: int
    role: str
    name: str
    depth: int
    props: str = ""


@dataclass(frozen=True)
class View:
    """One observation: the root, the content lines shown (``offset`` is the index of the first), how many are
    hidden below, and the error the action met (if any)."""

    root: Node
    nodes: tuple[Node, ...]
    offset: int
    below: int
    error: str | None = None

    @property
    def total(self) -> int:
        return self.offset + len(self.nodes) + self.below


def _node(line: str) -> Node | None:
    match = _LINE.match(line)
    if match is None:
        return None
    tabs, ident, role, quoted, props = match.groups()
    try:
        name = ast.literal_eval(quoted)
    except (ValueError, SyntaxError):
        name = quoted[1:-1]
    return Node(id=int(ident), role=role, name=str(name), depth=len(tabs), props=props.strip())


def parse_view(text: str) -> View | None:
    """The view an observation text shows, or None when it shows no page (an error with no output)."""
    error = None
    if text.startswith("ERROR: "):
        error, _, text = text.partition("\n")
        error = error.removeprefix("ERROR: ")
    root, nodes, offset, below = None, [], 0, 0
    for line in text.splitlines():
        if root is None:
            node = _node(line)
            if node is not None and node.role == "RootWebArea":
                root = node
            continue
        if match := _ABOVE.match(line):
            offset = int(match.group(1))
        elif match := _BELOW.match(line):
            below = int(match.group(1))
        elif (node := _node(line)) is not None:
            nodes.append(node)
    if root is None:
        return None
    return View(root=root, nodes=tuple(nodes), offset=offset, below=below, error=error)


@dataclass
class Page:
    """What one visit to a page has shown: its lines by index (the latest view of a line wins), and the views."""

    title: str
    total: int
    latest: View
    lines: dict[int, Node] = field(default_factory=dict)
    values: dict[int, str] = field(default_factory=dict)  # what this visit typed, by field id

    def add(self, view: View) -> None:
        self.latest, self.total, self.title = view, view.total, view.root.name
        for i, node in enumerate(view.nodes):
            self.lines[view.offset + i] = node

    def typed(self, node_id: int, text: str) -> None:
        """The field ``node_id`` now holds ``text``: what ``value`` answers for it for the rest of the visit (a
        later view may not show it: Chromium's tree drops a value that reads like the lines above it)."""
        self.values[node_id] = text

    def value(self, box: Node) -> str:
        """What the field ``box`` holds: what was typed into it this visit, else the text line just inside it
        (Chromium's tree: a box is named by its label, its value is a StaticText child), else its name (the text
        browser's: a box is named by its value)."""
        if box.id in self.values:
            return self.values[box.id]
        nodes = self.nodes
        at = next((i for i, n in enumerate(nodes) if n.id == box.id), None)
        inner = nodes[at + 1] if at is not None and at + 1 < len(nodes) else None
        if inner is not None and inner.role == "StaticText" and inner.depth == box.depth + 1:
            return inner.name
        return box.name

    @property
    def nodes(self) -> list[Node]:
        return [self.lines[i] for i in sorted(self.lines)]

    def find(self, match: Callable[[Node], bool]) -> Node | None:
        return next((n for n in self.nodes if match(n)), None)

    def after(self, anchor: Node | None) -> list[Node]:
        """The nodes after ``anchor`` in page order (all of them when ``anchor`` is None)."""
        nodes = self.nodes
        if anchor is None:
            return nodes
        at = next((i for i, n in enumerate(nodes) if n.id == anchor.id), len(nodes))
        return nodes[at + 1:]

    def scroll_for_more(self) -> str | None:
        """The scroll that shows lines this visit has not seen yet, nearest first; None when it has seen them all."""
        start, end = self.latest.offset, self.latest.offset + len(self.latest.nodes)
        unseen = [i for i in range(self.total) if i not in self.lines]
        if not unseen:
            return None
        below = [i for i in unseen if i >= end]
        above = [i for i in unseen if i < start]
        if below and (not above or below[0] - end <= start - above[-1]):
            return "scroll [down]"
        return "scroll [up]" if above else "scroll [down]"

    def seek(self, match: Callable[[Node], bool]) -> Node | str | None:
        """The first node ``match`` accepts, else the scroll that shows more of the page, else None (not here)."""
        return self.find(match) or self.scroll_for_more()


def visit(observations: Sequence[str], actions: Sequence[str]) -> Page | None:
    """The page the latest observation is on, with everything seen of it since the action that led to it.
    ``observations[i + 1]`` followed ``actions[i]``. A field typed into while out of view holds what was typed
    (the agent remembers what it typed, as a model's context does), until a view shows it."""
    views: list[tuple[int, View]] = []
    k = len(observations) - 1
    while k >= 0:
        view = parse_view(observations[k])
        if view is not None:
            if views and view.root.name != views[-1][1].root.name:
                break
            views.append((k, view))
        if k == 0:
            break
        failed = view is None or view.error is not None
        if not failed and not _STAYS.match(actions[k - 1]):
            break  # this observation is the first of its visit
        k -= 1
    if not views:
        return None
    views.reverse()
    page = Page(title=views[-1][1].root.name, total=views[-1][1].total, latest=views[-1][1])
    for i, (k, view) in enumerate(views):
        page.add(view)
        for j in range(k, views[i + 1][0] if i + 1 < len(views) else k):
            typed = _TYPED.match(actions[j])
            if typed and not observations[j + 1].startswith("ERROR: "):
                page.typed(int(typed.group(1)), typed.group(2))
    return page


def name_is(role: str, name: str) -> Callable[[Node], bool]:
    folded = name.casefold()
    return lambda n: n.role == role and n.name.casefold() == folded
