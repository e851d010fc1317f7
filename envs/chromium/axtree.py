"""WebArena's text form of a page's accessibility tree, built from Chromium's own (``Accessibility.getFullAXTree``).

Owns: the rules WebArena's ``browser_env/processors.py`` applies (a line is ``[id] role 'name' prop: value``,
indented by tabs; ``focusable``, ``editable``, ``readonly``, ``level``, ``settable``, ``multiline`` and ``invalid``
are not printed; a node without a name is dropped with its children hoisted when its role is a pure container, a
nameless ``listitem`` always; a StaticText line is dropped when empty or when its text is in one of the three lines
kept before it), the viewport cut, and the ids. Where it differs from WebArena, on purpose: the viewport is a window
on the whole page's lines (from the first whose box meets it to the last, with notes on the lines hidden above and
below, as the text browser shows one), not WebArena's own cut (non-meeting nodes dropped, children hoisted): an
agent scrolling sees one page's lines, numbered and indented once; ids are our own (the rank of the node in
document order among the printed nodes of the whole page, from 1): Chromium's AX node ids depend on what the renderer built before, so the
same page state in another browser would get other ids, and a fork or a replay could not give the agent the same
observation; the viewport test is plain intersection (WebArena's ratio has an operator-precedence slip that lets
nearly every intersecting node through, which this equals but for slivers).
Must never: print a node the agent could not act on by its id (every printed id maps to a DOM node or none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# WebArena's list, and ``url``: the Chromium of today reports it on the root and on links, WebArena's did not (the
# observation carries the URL apart)
IGNORED_PROPERTIES = frozenset({"focusable", "editable", "readonly", "level", "settable", "multiline", "invalid",
                                "url"})
# Chromium splits a text run into InlineTextBox nodes below its StaticText; WebArena's trees stop at the StaticText
SKIPPED_ROLES = frozenset({"InlineTextBox"})
CONTAINER_ROLES = frozenset({"generic", "img", "list", "strong", "paragraph", "banner", "navigation", "Section",
                             "LabelText", "Legend", "listitem"})
STATIC_TEXT_LOOKBACK = 3


@dataclass(frozen=True)
class AxLine:
    """One printed node: ``node_id`` (ours), ``backend_id`` (Chromium's DOM node, for input), its box in page
    coordinates (x, y, width, height; None when it has no layout), and its text without the indentation."""

    node_id: int
    role: str
    name: str
    depth: int
    text: str
    backend_id: int | None
    box: tuple[float, float, float, float] | None


@dataclass(frozen=True)
class AxTree:
    """The printed lines of one page in document order; ``by_id`` for actions. ``truncated``: why the page's tree
    was not read whole (it is too large to read within an observation's bounds), else empty."""

    lines: tuple[AxLine, ...]
    truncated: str = ""

    @property
    def by_id(self) -> dict[int, AxLine]:
        return {line.node_id: line for line in self.lines}

    def render(self, viewport: tuple[float, float, float, float] | None = None) -> str:
        """The tree's text; with ``viewport`` (x, y, width, height in page coordinates) the root and the lines of
        the whole page's text from the first whose box meets the viewport to the last, with a note when lines are
        hidden above or below (as the text browser shows a viewport: a window on the same numbered lines, so an
        agent scrolling sees one page's lines in one order)."""
        every = self._rows()
        if viewport is None:
            return "\n".join(text for _, text in every)
        shown = [k for k, (line, _) in enumerate(every) if k > 0 and _meets(line.box, viewport)]
        if shown:
            first, last = shown[0], shown[-1]
        else:  # between lines (a gap in the layout): nothing shown, the notes say where the lines are
            first = 1 + sum(1 for line, _ in every[1:] if line.box is not None and line.box[1] < viewport[1])
            last = first - 1
        above, below = first - 1, len(every) - 1 - last
        out = [text for _, text in every[:1]]
        if above > 0:
            out.append(f"\t(... {above} lines above; scroll up to see them)")
        out.extend(text for _, text in every[first:last + 1])
        if below > 0:
            out.append(f"\t(... {below} lines below; scroll down to see them)")
        return "\n".join(out)

    def _rows(self) -> list[tuple[AxLine, str]]:
        kept: list[tuple[AxLine, str]] = []
        stack: list[tuple[int, int]] = []  # (source depth, printed depth) of the ancestors printed
        for line in self.lines:
            while stack and stack[-1][0] >= line.depth:
                stack.pop()
            depth = stack[-1][1] + 1 if stack else 0
            stack.append((line.depth, depth))
            if line.role == "StaticText" and _repeats(line.name, [text for _, text in kept[-STATIC_TEXT_LOOKBACK:]]):
                continue
            kept.append((line, "\t" * depth + line.text))
        return kept


def _meets(box: tuple[float, float, float, float] | None, viewport: tuple[float, float, float, float]) -> bool:
    if box is None:
        return False
    x, y, w, h = box
    vx, vy, vw, vh = viewport
    return w > 0 and h > 0 and x < vx + vw and x + w > vx and y < vy + vh and y + h > vy


def _repeats(text: str, kept: list[str]) -> bool:
    return not text or any(text in previous for previous in kept[-STATIC_TEXT_LOOKBACK:])


def build(nodes: list[dict[str, Any]], boxes: dict[int, tuple[float, float, float, float]]) -> AxTree:
    """The printed lines of ``nodes`` (``getFullAXTree``'s, root first) with ``boxes`` by backend DOM node id
    (page coordinates, from ``DOMSnapshot.captureSnapshot``)."""
    if not nodes:
        return AxTree(lines=())
    by_ax: dict[str, dict[str, Any]] = {}
    for node in nodes:
        by_ax.setdefault(str(node.get("nodeId")), node)
    lines: list[AxLine] = []
    root = nodes[0]
    # (node, depth, the box of the nearest ancestor that has one: a node the snapshot has no box for, text inside a
    # form field's own shadow tree, is where its ancestor is)
    work: list[tuple[dict[str, Any], int, tuple[float, float, float, float] | None]] = [(root, 0, None)]
    while work:
        node, depth, outer = work.pop()
        printed = _line(node, depth, len(lines) + 1, boxes, outer)
        if printed is not None:
            lines.append(printed)
        below = depth + 1 if printed is not None else depth
        backend = node.get("backendDOMNodeId")
        inner = boxes.get(backend, outer) if isinstance(backend, int) else outer
        children = [by_ax[c] for c in node.get("childIds", []) if c in by_ax]
        work.extend((child, below, inner) for child in reversed(children))
    return AxTree(lines=tuple(lines))


def _line(node: dict[str, Any], depth: int, node_id: int, boxes: dict[int, tuple[float, float, float, float]],
          outer: tuple[float, float, float, float] | None) -> AxLine | None:
    if node.get("ignored"):
        return None
    role = _value(node.get("role"))
    name_field = node.get("name")
    if role is None or role in SKIPPED_ROLES or not isinstance(name_field, dict):
        return None
    name = str(name_field.get("value", ""))
    props = []
    for prop in node.get("properties", []):
        key = prop.get("name")
        value = prop.get("value", {})
        if key in IGNORED_PROPERTIES or not isinstance(value, dict) or "value" not in value:
            continue
        props.append(f"{key}: {_python_str(value['value'])}")
    if not name.strip() and ((not props and role in CONTAINER_ROLES) or role == "listitem"):
        return None
    text = f"[{node_id}] {role} {name!r}" + (" " + " ".join(props) if props else "")
    backend = node.get("backendDOMNodeId")
    backend_id = int(backend) if isinstance(backend, int) else None
    box = boxes.get(backend_id, outer) if backend_id is not None else outer
    return AxLine(node_id=node_id, role=str(role), name=name, depth=depth, text=text, backend_id=backend_id, box=box)


def _value(field: Any) -> Any:
    return field.get("value") if isinstance(field, dict) else None


def _python_str(value: Any) -> str:
    """A property value as WebArena prints it (Python's ``str``: ``True``, ``False``, numbers, text as is)."""
    return str(value)


def layout_boxes(snapshot: dict[str, Any]) -> dict[int, tuple[float, float, float, float]]:
    """Backend DOM node id -> its layout box (page coordinates) from ``DOMSnapshot.captureSnapshot`` (main
    document only; a node with several boxes, a wrapped inline, gets their union)."""
    documents = snapshot.get("documents") or []
    if not documents:
        return {}
    doc = documents[0]
    backend_ids = doc.get("nodes", {}).get("backendNodeId", [])
    layout = doc.get("layout", {})
    out: dict[int, tuple[float, float, float, float]] = {}
    for index, bounds in zip(layout.get("nodeIndex", []), layout.get("bounds", []), strict=False):
        if index >= len(backend_ids) or len(bounds) != 4:
            continue
        backend = backend_ids[index]
        x, y, w, h = (float(b) for b in bounds)
        if backend in out:
            ox, oy, ow, oh = out[backend]
            left, top = min(ox, x), min(oy, y)
            right, bottom = max(ox + ow, x + w), max(oy + oh, y + h)
            out[backend] = (left, top, right - left, bottom - top)
        else:
            out[backend] = (x, y, w, h)
    return out
