"""The document model of the text browser: HTML parsed into a tree of nodes, a CSS selector subset, the page's
rendered text (``outerText``) and HTML forms with their current field values.

Owns: ``Node`` (one element, text node or the document; form state such as a typed value lives on the node),
``parse_html`` (standard library ``html.parser``, tolerant of unclosed tags, void elements known), ``Selector``
(tag, ``.class``, ``#id``, ``[attr]``, ``[attr="v"]``, compound, descendant and child combinators, comma groups;
anything else raises ``SelectorError`` naming the selector), ``outer_text`` and the form helpers.
Must never: do I/O or know about tabs, history or the accessibility tree; node ids are document order only.
"""

from __future__ import annotations

import html.parser
import re
from collections.abc import Iterator

from ...errors import EnvsError

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                  "track", "wbr"})
# Elements whose content is never rendered as text.
NOT_RENDERED = frozenset({"head", "title", "script", "style", "template", "noscript", "meta", "link"})
BLOCK = frozenset({"address", "article", "aside", "blockquote", "body", "dd", "details", "dialog", "div", "dl", "dt",
                   "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
                   "header", "hr", "html", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table",
                   "tbody", "thead", "tfoot", "tr", "ul", "caption", "select", "option", "textarea", "legend"})
# Starting the key closes an open element of the set, searching the stack down to (not past) a boundary tag.
_IMPLIED_END = {
    "li": ({"li"}, {"ul", "ol", "menu"}),
    "option": ({"option"}, {"select", "datalist", "optgroup"}),
    "optgroup": ({"optgroup", "option"}, {"select"}),
    "tr": ({"tr", "td", "th"}, {"table", "tbody", "thead", "tfoot"}),
    "td": ({"td", "th"}, {"tr", "table"}),
    "th": ({"td", "th"}, {"tr", "table"}),
    "dt": ({"dt", "dd"}, {"dl"}),
    "dd": ({"dt", "dd"}, {"dl"}),
    "tbody": ({"tbody", "thead", "tr", "td", "th"}, {"table"}),
}
_P_CLOSERS = BLOCK - {"body", "html", "option", "select", "textarea", "tbody", "thead", "tfoot", "tr", "dd", "dt"}

TEXT = "#text"
DOCUMENT = "#document"


class SelectorError(EnvsError, ValueError):
    """A CSS selector outside the supported subset (or malformed); the message names the selector."""


class Node:
    """An element (``tag`` lower case), a text node (``tag == "#text"``) or the document (``"#document"``).

    ``node_id`` is the node's position in document order (the document is 1), assigned once after parsing: the same
    page always gives the same ids. ``value``/``checked`` are form state changed by the user (None: the markup's
    default).
    """

    __slots__ = ("tag", "attrs", "children", "parent", "text", "node_id", "value", "checked")

    def __init__(self, tag: str, attrs: dict[str, str] | None = None, text: str = ""):
        self.tag = tag
        self.attrs: dict[str, str] = attrs or {}
        self.children: list[Node] = []
        self.parent: Node | None = None
        self.text = text
        self.node_id = 0
        self.value: str | None = None
        self.checked: bool | None = None

    def __repr__(self) -> str:
        if self.tag == TEXT:
            return f"<text {self.text[:30]!r}>"
        return f"<{self.tag} #{self.node_id} {self.attrs}>"

    @property
    def is_element(self) -> bool:
        return not self.tag.startswith("#")

    @property
    def classes(self) -> list[str]:
        return self.attrs.get("class", "").split()

    def append(self, child: Node) -> None:
        child.parent = self
        self.children.append(child)

    def iter(self) -> Iterator[Node]:
        """This node and every descendant, in document order."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def elements(self) -> Iterator[Node]:
        return (n for n in self.iter() if n.is_element)

    def ancestors(self) -> Iterator[Node]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def closest(self, tag: str) -> Node | None:
        """This node or its nearest ancestor with ``tag``."""
        node: Node | None = self
        while node is not None and node.tag != tag:
            node = node.parent
        return node

    def text_content(self) -> str:
        """Concatenated text of every descendant text node (like DOM ``textContent``), script and style included."""
        return "".join(n.text for n in self.iter() if n.tag == TEXT)

    @property
    def outer_text(self) -> str:
        return outer_text(self)

    def query_selector(self, selector: str) -> Node | None:
        return Selector(selector).first(self)

    def query_selector_all(self, selector: str) -> list[Node]:
        return Selector(selector).all(self)

    def find_by_id(self, node_id: int) -> Node | None:
        for node in self.iter():
            if node.node_id == node_id:
                return node
        return None


# -- parsing -------------------------------------------------------------------------------------------------------


class _TreeBuilder(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.document = Node(DOCUMENT)
        self.stack = [self.document]

    def _close_implied(self, tag: str) -> None:
        rule = _IMPLIED_END.get(tag)
        if tag in _P_CLOSERS:
            rule = ({"p"} | (rule[0] if rule else set()), (rule[1] if rule else set()) | {"button", "td", "th"})
        if not rule:
            return
        closes, boundary = rule
        for depth in range(len(self.stack) - 1, 0, -1):
            open_tag = self.stack[depth].tag
            if open_tag in closes:
                del self.stack[depth:]
                return
            if open_tag in boundary:
                return

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._close_implied(tag)
        node = Node(tag, {k: (v if v is not None else "") for k, v in attrs})
        self.stack[-1].append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._close_implied(tag)
        self.stack[-1].append(Node(tag, {k: (v if v is not None else "") for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return
        # a stray end tag is ignored, as browsers do

    def handle_data(self, data: str) -> None:
        parent = self.stack[-1]
        if parent.children and parent.children[-1].tag == TEXT:
            parent.children[-1].text += data
        else:
            parent.append(Node(TEXT, text=data))


def parse_html(markup: str) -> Node:
    """The document node of ``markup``; every node numbered in document order (document = 1)."""
    builder = _TreeBuilder()
    builder.feed(markup)
    builder.close()
    for number, node in enumerate(builder.document.iter(), start=1):
        node.node_id = number
    return builder.document


def page_title(document: Node) -> str:
    title = document.query_selector("title")
    return " ".join(title.text_content().split()) if title is not None else ""


def body_of(document: Node) -> Node:
    return document.query_selector("body") or document


# -- selectors -----------------------------------------------------------------------------------------------------

_IDENT = r"-?[_a-zA-Z][_a-zA-Z0-9-]*"
_TOKEN = re.compile(
    rf"""(?P<ws>\s*(?P<comb>[>,])\s*|\s+)
       |(?P<tag>{_IDENT}|\*)
       |\.(?P<cls>{_IDENT})
       |\#(?P<id>-?[_a-zA-Z0-9-]+)
       |\[\s*(?P<attr>{_IDENT})\s*(?:=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>{_IDENT})))?\s*\]""",
    re.VERBOSE)


class _Compound:
    __slots__ = ("tag", "classes", "ident", "attrs")

    def __init__(self) -> None:
        self.tag: str | None = None
        self.classes: list[str] = []
        self.ident: str | None = None
        self.attrs: list[tuple[str, str | None]] = []

    def empty(self) -> bool:
        return self.tag is None and not self.classes and self.ident is None and not self.attrs

    def matches(self, node: Node) -> bool:
        if not node.is_element:
            return False
        if self.tag is not None and self.tag != "*" and node.tag != self.tag:
            return False
        if self.ident is not None and node.attrs.get("id") != self.ident:
            return False
        if self.classes:
            have = node.classes
            if any(c not in have for c in self.classes):
                return False
        for name, value in self.attrs:
            if name not in node.attrs or (value is not None and node.attrs[name] != value):
                return False
        return True


class Selector:
    """A parsed selector group: ``Selector("li.item > a.product-item-link, .price").all(document)``."""

    def __init__(self, selector: str):
        self.source = selector
        # each complex selector: compounds with the combinator *before* each ("" for the first, " " or ">")
        self.groups: list[list[tuple[str, _Compound]]] = self._parse(selector)

    def _error(self, what: str) -> SelectorError:
        return SelectorError(f"unsupported or malformed CSS selector {self.source!r}: {what} (supported: tag, .class, "
                             f"#id, [attr], [attr=\"v\"], compounds, descendant ' ' and child '>' combinators, ',')")

    def _parse(self, text: str) -> list[list[tuple[str, _Compound]]]:
        text = text.strip()
        if not text:
            raise self._error("empty selector")
        groups: list[list[tuple[str, _Compound]]] = []
        current: list[tuple[str, _Compound]] = []
        compound = _Compound()
        combinator = ""
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise self._error(f"unexpected {text[pos:pos + 12]!r} at offset {pos}")
            pos = m.end()
            if m.group("ws") is not None:
                if compound.empty():
                    if m.group("comb") is None and not current:
                        continue
                    raise self._error(f"combinator without a selector before it at offset {m.start()}")
                current.append((combinator, compound))
                compound = _Compound()
                comb = m.group("comb")
                if comb == ",":
                    groups.append(current)
                    current, combinator = [], ""
                else:
                    combinator = comb or " "
                continue
            if m.group("tag") is not None:
                if not compound.empty():
                    raise self._error(f"type selector {m.group('tag')!r} must come first in a compound")
                compound.tag = m.group("tag").lower()
            elif m.group("cls") is not None:
                compound.classes.append(m.group("cls"))
            elif m.group("id") is not None:
                compound.ident = m.group("id")
            else:
                value = m.group("dq") if m.group("dq") is not None else m.group("sq") if m.group("sq") is not None \
                    else m.group("bare")
                compound.attrs.append((m.group("attr").lower(), value))
        if compound.empty():
            raise self._error("ends with a combinator")
        current.append((combinator, compound))
        groups.append(current)
        return groups

    def matches(self, node: Node) -> bool:
        return any(self._matches_complex(node, chain, len(chain) - 1) for chain in self.groups)

    def _matches_complex(self, node: Node, chain: list[tuple[str, _Compound]], index: int) -> bool:
        combinator, compound = chain[index]
        if not compound.matches(node):
            return False
        if index == 0:
            return True
        if combinator == ">":
            return node.parent is not None and self._matches_complex(node.parent, chain, index - 1)
        return any(self._matches_complex(a, chain, index - 1) for a in node.ancestors())

    def all(self, root: Node) -> list[Node]:
        """Matching descendants of ``root`` (not ``root`` itself, as ``querySelectorAll``), in document order."""
        return [n for n in root.iter() if n is not root and self.matches(n)]

    def first(self, root: Node) -> Node | None:
        return next((n for n in root.iter() if n is not root and self.matches(n)), None)


# -- rendered text -------------------------------------------------------------------------------------------------

_SPACE = re.compile(r"[ \t\n\r\f]+")


def outer_text(node: Node) -> str:
    """The node's rendered text, like the DOM's ``innerText``/``outerText``: whitespace collapsed, block elements
    on their own lines, ``<br>`` a line break, table cells separated by tabs, script/style/head left out.
    Form fields contribute nothing (as in the DOM), except that the text of a field itself is its current value."""
    if node.tag in ("input", "textarea", "select"):
        return field_value(node)
    parts: list[str | int] = []  # strings, or ints = required line breaks

    def walk(n: Node) -> None:
        if n.tag == TEXT:
            text = _SPACE.sub(" ", n.text)
            if text:
                parts.append(text)
            return
        if n.tag in NOT_RENDERED or "hidden" in n.attrs or n.tag in ("input", "textarea", "select", "option"):
            return
        if n.tag == "br":
            parts.append("\n")
            return
        breaks = 2 if n.tag == "p" else 1 if n.tag in BLOCK else 0
        if breaks:
            parts.append(breaks)
        for child in n.children:
            walk(child)
            if child.tag in ("td", "th") and child is not n.children[-1]:
                parts.append("\t")
        if breaks:
            parts.append(breaks)

    walk(node)
    out: list[str] = []
    pending = 0
    for part in parts:
        if isinstance(part, int):
            pending = max(pending, part)
            continue
        if pending and out:
            out.append("\n" * pending)
        pending = 0
        if part.startswith(" ") and (not out or out[-1].endswith((" ", "\n", "\t"))):
            part = part[1:]  # collapsible space next to another space or a line start
        if part:
            out.append(part)
    lines = "".join(out).split("\n")
    cleaned = [_strip_line(line) for line in lines]
    return "\n".join(cleaned).strip("\n")


def _strip_line(line: str) -> str:
    return "\t".join(" ".join(cell.split(" ")).strip(" ") for cell in line.split("\t")).strip(" ")


# -- forms ---------------------------------------------------------------------------------------------------------

SUBMIT_TYPES = frozenset({"submit", "image"})
BUTTON_TYPES = frozenset({"submit", "image", "button", "reset"})
TEXT_INPUT_TYPES = frozenset({"", "text", "search", "email", "password", "number", "tel", "url", "date", "month",
                              "week", "time", "datetime-local", "color"})


def input_type(node: Node) -> str:
    return node.attrs.get("type", "").lower() if node.tag == "input" else ""


def is_text_field(node: Node) -> bool:
    return node.tag == "textarea" or (node.tag == "input" and input_type(node) in TEXT_INPUT_TYPES)


def is_submit(node: Node) -> bool:
    if node.tag == "button":
        return node.attrs.get("type", "submit").lower() == "submit"
    return node.tag == "input" and input_type(node) in SUBMIT_TYPES


def enclosing_form(node: Node) -> Node | None:
    """The form ``node`` belongs to: its ``form="id"`` attribute, else the nearest ancestor ``<form>``."""
    owner = node.attrs.get("form")
    if owner:
        root = node
        while root.parent is not None:
            root = root.parent
        found = next((n for n in root.elements() if n.tag == "form" and n.attrs.get("id") == owner), None)
        if found is not None:
            return found
    return node.closest("form")


def options_of(select: Node) -> list[Node]:
    return [n for n in select.iter() if n.tag == "option"]


def option_value(option: Node) -> str:
    return option.attrs["value"] if "value" in option.attrs else " ".join(option.text_content().split())


def selected_option(select: Node) -> Node | None:
    options = options_of(select)
    if select.value is not None:
        return next((o for o in options if option_value(o) == select.value), None)
    return next((o for o in options if "selected" in o.attrs), options[0] if options else None)


def is_checked(node: Node) -> bool:
    return node.checked if node.checked is not None else "checked" in node.attrs


def field_value(node: Node) -> str:
    """The current value of an input, textarea or select (the user's, else the markup's default)."""
    if node.tag == "select":
        option = selected_option(node)
        return option_value(option) if option is not None else ""
    if node.value is not None:
        return node.value
    if node.tag == "textarea":
        text = node.text_content()
        return text[1:] if text.startswith("\n") else text
    if input_type(node) in ("checkbox", "radio"):
        return node.attrs.get("value", "on")
    return node.attrs.get("value", "")


def form_fields(form: Node, submitter: Node | None = None) -> list[tuple[str, str]]:
    """The form's data set in document order: named, enabled inputs (hidden ones included), textareas and selects;
    checkboxes and radios only when checked; a submit button only when it is the ``submitter``."""
    fields = []
    root = form
    while root.parent is not None:
        root = root.parent
    form_id = form.attrs.get("id")
    for node in root.elements():
        if node.tag not in ("input", "textarea", "select", "button"):
            continue
        if enclosing_form(node) is not form and not (form_id and node.attrs.get("form") == form_id):
            continue
        name = node.attrs.get("name")
        if not name or "disabled" in node.attrs:
            continue
        if node.tag == "button" or input_type(node) in BUTTON_TYPES:
            if node is submitter and is_submit(node):
                fields.append((name, node.attrs.get("value", "")))
            continue
        if input_type(node) in ("checkbox", "radio") and not is_checked(node):
            continue
        if input_type(node) == "file":
            continue
        fields.append((name, field_value(node)))
    return fields
