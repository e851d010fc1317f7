"""The accessibility tree of a page, rendered as WebArena's text observation, and the viewport over it.

Owns: roles and names from tags (``a[href]`` link, buttons, textboxes, comboboxes, options, images, headings,
list items, tables, ``StaticText`` for text runs, ``RootWebArea`` for the document), the line layout of the whole
page (one line per shown node, tab-indented by depth, ``[id] role 'name' prop: value``, names as Python ``repr`` as
WebArena prints them) and the viewport: a window of ``lines_per_viewport`` lines after the root line.
Element ids are the DOM nodes' document-order numbers (``dom.Node.node_id``): the same page state gives the same
ids whatever the scroll position. Generic wrappers (div, span, form, nav, p... without a role) are not shown:
their children are lifted to the wrapper's depth.
Bounded on any page: one line per shown node at most (the DOM holds at most ``dom.MAX_NODES``); names are cut at
``MAX_NAME_CHARS`` (and only their first ``8 x MAX_NAME_CHARS`` raw characters are looked at); lines are indented
``MAX_INDENT`` tabs at most; names from content share one walk budget per tree (``NAME_WALK_BUDGET``), each
label's text and each select's options are worked out once, and the layout is one iterative walk (no recursion,
no per-node climb to an ancestor): building a tree is linear in the page.
Must never: do I/O or change the DOM; it only reads the nodes and their form state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from . import dom

LINE_HEIGHT = 20  # px per laid-out line, shared with the screenshot
# A name (text run, link, heading, field value, label, title) longer than this is cut, with an ellipsis. The shop's
# longest is under 200; a page cannot make one line, or one observation, of megabytes.
MAX_NAME_CHARS = 1000
_RAW_CHARS = 8 * MAX_NAME_CHARS  # raw text looked at for one name (enough for its whitespace to collapse)
# Lines are indented by their depth in the tree up to this many tabs (the shop's deepest is 4); deeper lines are
# shown at this depth, so a deep page cannot make lines of hundreds of tabs.
MAX_INDENT = 32
# Node visits spent on names from content for one tree (a link's text, a row's cells, a label's text). Nested
# named elements would otherwise walk the same descendants once per ancestor (O(nodes x depth)); a real page
# spends about one visit per node. Past it, further names are empty or cut.
NAME_WALK_BUDGET = 200_000
HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# Roles named from their content: their text is the name, so it is not repeated as StaticText children.
NAMED_FROM_CONTENT = frozenset({"link", "button", "heading", "option", "cell", "columnheader", "rowheader", "row"})
EXPLICIT_ROLES = frozenset({"link", "button", "textbox", "searchbox", "combobox", "heading", "listitem", "img",
                            "checkbox", "radio", "option", "table", "row", "cell", "columnheader", "rowheader",
                            "tab", "menuitem", "alert", "dialog", "separator"})


@dataclass(frozen=True, slots=True)
class Line:
    """One node of the tree as shown: ``[node_id] role 'name' props``, at ``depth`` tabs."""

    depth: int
    node_id: int
    role: str
    name: str
    props: tuple[tuple[str, str], ...] = ()
    value: str | None = None  # a field's current value (the screenshot shows it; None when not a field)
    placeholder: str = ""  # a field's placeholder or label (the screenshot shows it greyed when empty)

    def render(self) -> str:
        text = f"{chr(9) * self.depth}[{self.node_id}] {self.role} {self.name!r}"
        if self.props:
            text += " " + " ".join(f"{k}: {v}" for k, v in self.props)
        return text


@dataclass(frozen=True, slots=True)
class Tree:
    """The whole page laid out: the root line, the content lines (depth >= 1) and the DOM node behind each id."""

    root: Line
    lines: tuple[Line, ...]
    nodes: dict[int, dom.Node]

    def text(self) -> str:
        """The full tree (every line, no viewport)."""
        return "\n".join([self.root.render(), *(line.render() for line in self.lines)])


def _squash(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str) -> str:
    """A name as shown: at most ``MAX_NAME_CHARS`` characters, an ellipsis marking a cut."""
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS - 1] + "\u2026"


def _name(text: str) -> str:
    """Whitespace collapsed and cut; only the start of a long text is looked at (the rest would be cut)."""
    return _cut(_squash(text[:_RAW_CHARS]))


def is_hidden(node: dom.Node) -> bool:
    if node.tag in dom.NOT_RENDERED or "hidden" in node.attrs or node.attrs.get("aria-hidden") == "true":
        return True
    if node.tag == "input" and dom.input_type(node) == "hidden":
        return True
    style = node.attrs.get("style", "").replace(" ", "").lower()
    return "display:none" in style or "visibility:hidden" in style


# Elements whose role is their tag's alone (the others depend on attributes or on their row).
TAG_ROLES = {"button": "button", "textarea": "textbox", "select": "combobox", "option": "option", "li": "listitem",
             "table": "table", "tr": "row", "td": "cell", "hr": "separator",
             **{h: "heading" for h in HEADINGS}}


def role_of(node: dom.Node, header_rows: dict[int, bool] | None = None) -> str | None:
    """The node's role, or None for a generic wrapper (its children are lifted). ``header_rows`` caches, per
    row, whether all its cells are headers (a ``th`` asks its row; without a cache a wide row is quadratic)."""
    explicit = node.attrs.get("role", "").strip().lower()
    if explicit in EXPLICIT_ROLES:
        return "textbox" if explicit == "searchbox" else explicit
    tag = node.tag
    if tag == "a":
        return "link" if "href" in node.attrs else None
    if tag == "input":
        kind = dom.input_type(node)
        if kind in dom.BUTTON_TYPES or kind == "file":
            return "button"
        if kind in ("checkbox", "radio"):
            return kind
        return "textbox" if kind in dom.TEXT_INPUT_TYPES else None
    if tag in TAG_ROLES:
        return TAG_ROLES[tag]
    if tag == "img":
        return "img" if node.attrs.get("alt", "x") != "" else None  # alt="" marks a decorative image
    if tag == "th":
        row = node.parent
        if row is None:
            return "columnheader"
        headers = header_rows.get(id(row)) if header_rows is not None else None
        if headers is None:
            headers = all(c.tag == "th" for c in row.children if c.tag in ("td", "th"))
            if header_rows is not None:
                header_rows[id(row)] = headers
        return "columnheader" if headers else "rowheader"
    return None


class _Namer:
    """Names from content for one tree, within budgets: every walk below a node (content names, label texts,
    a select's options) takes from one budget of ``NAME_WALK_BUDGET`` node visits, and gathers at most
    ``_RAW_CHARS`` characters; labels' texts and selects' chosen options are worked out once each."""

    def __init__(self, budget: int = NAME_WALK_BUDGET):
        self.budget = budget
        self.header_rows: dict[int, bool] = {}
        self._label_texts: dict[int, str] = {}
        self._options: dict[int, tuple[list[dom.Node], dom.Node | None]] = {}

    def options(self, select: dom.Node) -> tuple[list[dom.Node], dom.Node | None]:
        """The select's options and its chosen one."""
        found = self._options.get(id(select))
        if found is None:
            options = dom.options_of(select)
            self.budget -= len(options)
            found = self._options[id(select)] = (options, dom.selected_option(select, options))
        return found

    def field_value(self, node: dom.Node) -> str:
        if node.tag == "select":
            chosen = self.options(node)[1]
            return dom.option_value(chosen) if chosen is not None else ""
        return dom.field_value(node)

    def label_text(self, label: dom.Node) -> str:
        text = self._label_texts.get(id(label))
        if text is None:
            text = self._label_texts[id(label)] = _name("".join(self._texts(label)))
        return text

    def _texts(self, node: dom.Node) -> Iterator[str]:
        """The text runs below ``node`` in document order, at most ``_RAW_CHARS`` characters in all, within the
        budget. Children are taken one at a time (a node with 20,000 children costs what is visited)."""
        size = 0
        stack = [iter((node,))]
        while stack and size < _RAW_CHARS and self.budget > 0:
            n = next(stack[-1], None)
            if n is None:
                stack.pop()
                continue
            self.budget -= 1
            if n.tag == dom.TEXT:
                yield n.text[:_RAW_CHARS - size]
                size += len(n.text)
            elif n.children:
                stack.append(iter(n.children))

    def content_name(self, node: dom.Node) -> str:
        """Text of the node's visible descendants (images by their alt, fields by their value), whitespace
        collapsed; a block or a cell is followed by a space. Walked as ``_texts`` walks."""
        parts: list[str] = []
        size = 0
        stack: list[tuple[Iterator[dom.Node], str]] = [(iter((node,)), "")]  # children, and what follows them
        while stack and size < _RAW_CHARS and self.budget > 0:
            children, after = stack[-1]
            n = next(children, None)
            if n is None:
                stack.pop()
                parts.append(after)
                continue
            self.budget -= 1
            if n.tag == dom.TEXT:
                parts.append(n.text[:_RAW_CHARS - size])
                size += len(parts[-1])
                continue
            spaced = " " if n is not node and (n.tag in dom.BLOCK or n.tag in ("td", "th")) else ""
            if n is not node and is_hidden(n):
                parts.append(spaced)
                continue
            if n.tag == "img":
                parts.append(" " + n.attrs.get("alt", "")[:_RAW_CHARS] + " ")
            elif n.tag in ("input", "textarea", "select") and n is not node:
                parts.append(" " + self.field_value(n)[:_RAW_CHARS] + " ")
            stack.append((iter(n.children), spaced))
        return _name("".join(parts))

    def field_label(self, node: dom.Node, labels: dict[str, dom.Node], wrapping: dom.Node | None) -> str:
        """A field's accessible name without its value: aria-label, <label>, placeholder, title, in that order
        (``wrapping``: the nearest label around the field)."""
        if node.attrs.get("aria-label"):
            return _name(node.attrs["aria-label"])
        ident = node.attrs.get("id")
        if ident and ident in labels:
            return self.label_text(labels[ident])
        if wrapping is not None:
            return self.label_text(wrapping)
        return _name(node.attrs.get("placeholder") or node.attrs.get("title") or "")


def content_name(node: dom.Node) -> str:
    """Text of the node's visible descendants (images by their alt), whitespace collapsed and cut."""
    return _Namer().content_name(node)


def field_label(node: dom.Node, labels: dict[str, dom.Node]) -> str:
    """A field's accessible name without its value: aria-label, <label>, placeholder, title, in that order."""
    return _Namer().field_label(node, labels, node.closest("label"))


def _labels(document: dom.Node) -> dict[str, dom.Node]:
    return {n.attrs["for"]: n for n in document.elements() if n.tag == "label" and n.attrs.get("for")}


def build(document: dom.Node, title: str, focused: int | None = None) -> Tree:
    """Lay out the page's accessibility tree; ``focused`` is the node id that has focus (or None). One walk of the
    document, depth-first with an explicit stack; each entry carries what the node needs from its ancestors
    (its shown depth, whether its text is already its ancestor's name, the nearest label and select)."""
    labels = _labels(document)
    namer = _Namer()
    lines: list[Line] = []
    nodes: dict[int, dom.Node] = {}

    def emit(node: dom.Node, depth: int, role: str, name: str, props: list[tuple[str, str]],
             value: str | None = None, placeholder: str = "") -> None:
        if node.node_id == focused:
            props = [("focused", "True"), *props]
        if "disabled" in node.attrs:
            props.append(("disabled", "True"))
        lines.append(Line(min(depth, MAX_INDENT), node.node_id, role, _cut(name), tuple(props),
                          None if value is None else _cut(value), _cut(placeholder)))
        nodes[node.node_id] = node

    # (node, depth, quiet: inside a node named from its content, nearest label, nearest select)
    stack: list[tuple[dom.Node, int, bool, dom.Node | None, dom.Node | None]] = [
        (child, 1, False, None, None) for child in reversed(document.children)]
    while stack:
        node, depth, quiet, label, select = stack.pop()
        if node.tag == dom.TEXT:
            text = _name(node.text)
            if text and not quiet:
                emit(node, depth, "StaticText", text, [])
            continue
        if is_hidden(node):
            continue
        role = role_of(node, namer.header_rows)
        if role in ("textbox", "combobox", "checkbox", "radio") or (node.tag == "input" and role == "button"):
            field_label = namer.field_label(node, labels, label)
            required = [("required", str("required" in node.attrs))]
            if role == "textbox":
                value = dom.field_value(node)
                emit(node, depth, role, value or field_label, required, value, field_label)
            elif role == "combobox":
                options, chosen = namer.options(node)
                text = namer.content_name(chosen) if chosen is not None else ""
                emit(node, depth, role, text or field_label,
                     [("hasPopup", "menu"), ("expanded", "False"), *required], text, field_label)
                stack.extend((option, depth + 1, False, label, node) for option in reversed(options)
                             if not is_hidden(option))
            elif role in ("checkbox", "radio"):
                emit(node, depth, role, field_label, [("checked", str(dom.is_checked(node)).lower()), *required])
            else:  # input buttons: the value is the name
                default = {"submit": "Submit", "reset": "Reset", "file": "Choose File"}.get(dom.input_type(node), "")
                emit(node, depth, "button", _name(node.attrs.get("value", "")) or field_label or default, [])
            continue
        label = node if node.tag == "label" else label
        select = node if node.tag == "select" else select
        if role is None:
            stack.extend((child, depth, quiet, label, select) for child in reversed(node.children))
            continue
        if role == "img":
            emit(node, depth, role, _name(node.attrs.get("alt", "")), [])
            continue
        name = _name(node.attrs.get("aria-label", "")) or (
            namer.content_name(node) if role in NAMED_FROM_CONTENT else "")
        props: list[tuple[str, str]] = []
        if role == "option":
            chosen = namer.options(select)[1] if select is not None else None
            props.append(("selected", str(chosen is node)))
        emit(node, depth, role, name, props)
        quiet = quiet or role in NAMED_FROM_CONTENT
        stack.extend((child, depth + 1, quiet, label, select) for child in reversed(node.children))
    root = Line(0, document.node_id, "RootWebArea", _cut(title), (("focused", "True"),))
    nodes[document.node_id] = document
    return Tree(root, tuple(lines), nodes)


def max_scroll(tree: Tree, lines_per_viewport: int) -> int:
    """The last valid scroll position (first shown line), as a browser clamps scrollTop."""
    return max(0, len(tree.lines) - lines_per_viewport)


def render_viewport(tree: Tree, scroll: int, lines_per_viewport: int) -> str:
    """The root line, then the content lines ``[scroll, scroll + lines_per_viewport)``, with a note when lines are
    hidden above or below (WebArena's current-viewport-only observation)."""
    scroll = min(max(0, scroll), max_scroll(tree, lines_per_viewport))
    shown = tree.lines[scroll:scroll + lines_per_viewport]
    out = [tree.root.render()]
    if scroll > 0:
        out.append(f"\t(... {scroll} lines above; scroll up to see them)")
    out.extend(line.render() for line in shown)
    below = len(tree.lines) - scroll - len(shown)
    if below > 0:
        out.append(f"\t(... {below} lines below; scroll down to see them)")
    return "\n".join(out)
