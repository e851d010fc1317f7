"""The accessibility tree of a page, rendered as WebArena's text observation, and the viewport over it.

Owns: roles and names from tags (``a[href]`` link, buttons, textboxes, comboboxes, options, images, headings,
list items, tables, ``StaticText`` for text runs, ``RootWebArea`` for the document), the line layout of the whole
page (one line per shown node, tab-indented by depth, ``[id] role 'name' prop: value``, names as Python ``repr`` as
WebArena prints them) and the viewport: a window of ``lines_per_viewport`` lines after the root line.
Element ids are the DOM nodes' document-order numbers (``dom.Node.node_id``): the same page state gives the same
ids whatever the scroll position. Generic wrappers (div, span, form, nav, p... without a role) are not shown:
their children are lifted to the wrapper's depth.
Must never: do I/O or change the DOM; it only reads the nodes and their form state.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import dom

LINE_HEIGHT = 20  # px per laid-out line, shared with the screenshot
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


def is_hidden(node: dom.Node) -> bool:
    if node.tag in dom.NOT_RENDERED or "hidden" in node.attrs or node.attrs.get("aria-hidden") == "true":
        return True
    if node.tag == "input" and dom.input_type(node) == "hidden":
        return True
    style = node.attrs.get("style", "").replace(" ", "").lower()
    return "display:none" in style or "visibility:hidden" in style


def role_of(node: dom.Node) -> str | None:
    """The node's role, or None for a generic wrapper (its children are lifted)."""
    explicit = node.attrs.get("role", "").strip().lower()
    if explicit in EXPLICIT_ROLES:
        return "textbox" if explicit == "searchbox" else explicit
    tag = node.tag
    if tag == "a":
        return "link" if "href" in node.attrs else None
    if tag == "button":
        return "button"
    if tag == "input":
        kind = dom.input_type(node)
        if kind in dom.BUTTON_TYPES or kind == "file":
            return "button"
        if kind in ("checkbox", "radio"):
            return kind
        return "textbox" if kind in dom.TEXT_INPUT_TYPES else None
    if tag == "textarea":
        return "textbox"
    if tag == "select":
        return "combobox"
    if tag == "option":
        return "option"
    if tag == "img":
        return "img" if node.attrs.get("alt", "x") != "" else None  # alt="" marks a decorative image
    if tag in HEADINGS:
        return "heading"
    if tag == "li":
        return "listitem"
    if tag == "table":
        return "table"
    if tag == "tr":
        return "row"
    if tag == "td":
        return "cell"
    if tag == "th":
        row = node.parent
        cells = [c for c in row.children if c.tag in ("td", "th")] if row is not None else []
        return "columnheader" if all(c.tag == "th" for c in cells) else "rowheader"
    if tag == "hr":
        return "separator"
    return None


def content_name(node: dom.Node) -> str:
    """Text of the node's visible descendants (images by their alt), whitespace collapsed."""
    parts: list[str] = []

    def walk(n: dom.Node) -> None:
        if n.tag == dom.TEXT:
            parts.append(n.text)
            return
        if n is not node and is_hidden(n):
            return
        if n.tag == "img":
            parts.append(" " + n.attrs.get("alt", "") + " ")
        elif n.tag in ("input", "textarea", "select") and n is not node:
            parts.append(" " + dom.field_value(n) + " ")
        for child in n.children:
            walk(child)
            if child.is_element and child.tag in dom.BLOCK | {"td", "th"}:
                parts.append(" ")

    walk(node)
    return _squash("".join(parts))


def _labels(document: dom.Node) -> dict[str, dom.Node]:
    return {n.attrs["for"]: n for n in document.elements() if n.tag == "label" and n.attrs.get("for")}


def field_label(node: dom.Node, labels: dict[str, dom.Node]) -> str:
    """A field's accessible name without its value: aria-label, <label>, placeholder, title, in that order."""
    if node.attrs.get("aria-label"):
        return _squash(node.attrs["aria-label"])
    ident = node.attrs.get("id")
    if ident and ident in labels:
        return _squash(labels[ident].text_content())
    wrapping = node.closest("label")
    if wrapping is not None:
        return _squash("".join(n.text for n in wrapping.iter() if n.tag == dom.TEXT))
    return _squash(node.attrs.get("placeholder") or node.attrs.get("title") or "")


def build(document: dom.Node, title: str, focused: int | None = None) -> Tree:
    """Lay out the page's accessibility tree; ``focused`` is the node id that has focus (or None)."""
    labels = _labels(document)
    lines: list[Line] = []
    nodes: dict[int, dom.Node] = {}

    def emit(node: dom.Node, depth: int, role: str, name: str, props: list[tuple[str, str]],
             value: str | None = None, placeholder: str = "") -> None:
        if node.node_id == focused:
            props = [("focused", "True"), *props]
        if "disabled" in node.attrs:
            props.append(("disabled", "True"))
        lines.append(Line(depth, node.node_id, role, name, tuple(props), value, placeholder))
        nodes[node.node_id] = node

    def visit(node: dom.Node, depth: int, quiet: bool) -> None:
        """``quiet``: inside a node named from its content, whose text is not repeated as StaticText."""
        if node.tag == dom.TEXT:
            text = _squash(node.text)
            if text and not quiet:
                emit(node, depth, "StaticText", text, [])
            return
        if is_hidden(node):
            return
        role = role_of(node)
        if role is None:
            for child in node.children:
                visit(child, depth, quiet)
            return
        if role in ("textbox", "combobox", "checkbox", "radio") or (node.tag == "input" and role == "button"):
            field(node, depth, role)
            return
        if role == "img":
            emit(node, depth, role, _squash(node.attrs.get("alt", "")), [])
            return
        name = _squash(node.attrs.get("aria-label", "")) or (content_name(node) if role in NAMED_FROM_CONTENT else "")
        props: list[tuple[str, str]] = []
        if role == "option":
            select = node.closest("select")
            chosen = dom.selected_option(select) if select is not None else None
            props.append(("selected", str(chosen is node)))
        emit(node, depth, role, name, props)
        for child in node.children:
            visit(child, depth + 1, quiet or role in NAMED_FROM_CONTENT)

    def field(node: dom.Node, depth: int, role: str) -> None:
        label = field_label(node, labels)
        required = [("required", str("required" in node.attrs))]
        if role == "textbox":
            value = dom.field_value(node)
            emit(node, depth, role, value or label, required, value, label)
        elif role == "combobox":
            chosen = dom.selected_option(node)
            text = content_name(chosen) if chosen is not None else ""
            emit(node, depth, role, text or label, [("hasPopup", "menu"), ("expanded", "False"), *required],
                 text, label)
            for option in dom.options_of(node):
                if not is_hidden(option):
                    visit(option, depth + 1, False)
        elif role in ("checkbox", "radio"):
            emit(node, depth, role, label, [("checked", str(dom.is_checked(node)).lower()), *required])
        else:  # input buttons: the value is the name
            default = {"submit": "Submit", "reset": "Reset", "file": "Choose File"}.get(dom.input_type(node), "")
            emit(node, depth, "button", _squash(node.attrs.get("value", "")) or label or default, [])

    for child in document.children:
        visit(child, 1, False)
    root = Line(0, document.node_id, "RootWebArea", title, (("focused", "True"),))
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
