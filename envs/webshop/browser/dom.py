"""The document model of the text browser: HTML parsed into a tree of nodes and the page's rendered text
(``outerText``). Its node (``node.py``), CSS selector subset (``css.py``) and form helpers (``forms.py``) are
re-exported here, so ``dom.Node``, ``dom.Selector``, ``dom.form_fields`` and friends name them.

Owns: ``parse`` / ``parse_html`` (standard library ``html.parser``, tolerant of unclosed tags, void elements known),
``query_selector`` / ``query_selector_all`` (a tree's descendants matching a selector), ``page_title``,
``body_of`` and ``outer_text``.

Bounded on any input (the agent chooses the pages it opens, so a page is hostile input):
- Parsing is linear: the markup is fed in ``FEED_CHUNK`` pieces; the implied-end-tag rules and end tags find their
  open element through per-tag stacks of open positions (O(1) amortised per tag, never a scan of the open
  elements); text runs are gathered and joined once. A tree is at most ``MAX_DEPTH`` deep (deeper start tags
  become children of the deepest allowed element, as Blink's parser caps nesting) and holds at most
  ``MAX_NODES`` nodes; html.parser reports at most ``MAX_EVENTS`` events (tags, attributes, text pieces,
  comments) and no start tag may stay unfinished past ``MAX_TAG_CHARS`` (html.parser re-scans it per piece).
  Past a budget the page is truncated (the parser is fed no more) and ``Parsed.truncated`` says why.
  Unfinished constructs at the end (a comment, a tag) are dropped as HTML5 does at end of file, never re-scanned
  character by character; selects never nest (a ``<select>`` closes an open one, as in HTML5).
- Nothing walks a tree recursively (``iter``, ``outer_text``, the selectors, pickling are iterative: a deep tree
  never raises ``RecursionError``); ``find_by_id`` descends by document order (O(depth x log children)).
- A tree pickles as a flat list (``node.py``).
Must never: do I/O or know about tabs, history or the accessibility tree; node ids are document order only.
"""

from __future__ import annotations

import html
import html.parser
import re
from dataclasses import dataclass

from .css import Selector, SelectorError
from .forms import (
    BUTTON_TYPES,
    SUBMIT_TYPES,
    TEXT_INPUT_TYPES,
    enclosing_form,
    field_value,
    form_fields,
    input_type,
    is_checked,
    is_submit,
    is_text_field,
    option_label,
    option_value,
    options_of,
    selected_option,
)
from .node import DOCUMENT, TEXT, Node

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
    "select": ({"select"}, set()),  # selects never nest (HTML5: a <select> in a select closes it)
}
_P_CLOSERS = BLOCK - {"body", "html", "option", "select", "textarea", "tbody", "thead", "tfoot", "tr", "dd", "dt"}

# Blink's HTML parser nests at most 512 elements (kMaximumHTMLParserDOMTreeDepth); deeper ones become children of
# the deepest allowed element. Real pages are a few dozen deep (the shop's: under 10).
MAX_DEPTH = 512
# Elements plus text runs per page (document included). A Magento page has a few thousand elements (the shop's
# largest page here: ~320 nodes); past this the page is truncated, so what is built after it (the accessibility
# tree, the raster, selectors) stays bounded too.
MAX_NODES = 50_000
# Events html.parser reports (tags and their attributes, end tags, text pieces, comments) per page: each costs
# about a microsecond whether or not it makes a node, so markup made of stray end tags or lone "<"s is bounded
# too. A real page makes a few per node; past this the page is truncated as past MAX_NODES.
MAX_EVENTS = 4 * MAX_NODES
# Markup handed to the parser at once: the budgets are checked between pieces, so at most one piece is parsed
# after a budget ran out.
FEED_CHUNK = 256 << 10
# html.parser re-scans an unfinished start tag from its "<" on every piece fed (its attribute regex runs at about
# 4 MB/s), so a tag still open after this many characters ends the page (truncated). Real tags are far shorter;
# a long one is an inline data: URL.
MAX_TAG_CHARS = 256 << 10


# -- parsing -------------------------------------------------------------------------------------------------------


def _implied_end_rules() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per start tag: the open elements it closes and the tags that shield them (a tag in both sets closes)."""
    rules = {}
    for tag in set(_IMPLIED_END) | _P_CLOSERS:
        closes, boundary = _IMPLIED_END.get(tag, (set(), set()))
        if tag in _P_CLOSERS:
            closes, boundary = closes | {"p"}, boundary | {"button", "td", "th"}
        rules[tag] = (tuple(sorted(closes)), tuple(sorted(boundary - closes)))
    return rules


_RULES = _implied_end_rules()


class _TreeBuilder(html.parser.HTMLParser):
    """Builds the tree from html.parser's events. ``stack`` holds the open elements (the document first);
    ``open`` maps a tag to the stack positions of its open elements, ascending, so an end tag or an implied end
    finds its element without scanning the stack."""

    def __init__(self, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> None:
        super().__init__(convert_charrefs=True)
        self.max_nodes, self.max_depth = max_nodes, max_depth
        self.document = Node(DOCUMENT)
        self.stack = [self.document]
        self.open: dict[str, list[int]] = {}
        self.nodes = 1
        self.events = 0
        self.truncated = ""  # why the page was cut ("" when it was not)
        self._text: Node | None = None  # the text node data is being gathered into, and the pieces so far
        self._pieces: list[str] = []

    def _parent(self) -> Node:
        """Where new content goes: the current element, or the deepest element allowed by ``max_depth``."""
        return self.stack[min(len(self.stack), self.max_depth) - 1]

    def _flush(self) -> None:
        if self._text is not None:
            self._text.text = "".join(self._pieces)
            self._text, self._pieces = None, []

    def _counted(self, events: int = 1) -> bool:
        """Count parser events (a tag counts one per attribute too); False once the page is cut."""
        self.events += events
        if self.events > MAX_EVENTS and not self.truncated:
            self.truncated = f"more than {MAX_EVENTS:,} tags and text runs"
        return not self.truncated

    def _add(self, node: Node) -> bool:
        self._flush()
        if self.nodes >= self.max_nodes:
            self.truncated = f"more than {self.max_nodes:,} elements and text runs"
            return False
        self._parent().append(node)
        self.nodes += 1
        return True

    def _pop_to(self, position: int) -> None:
        for node in self.stack[position:]:
            self.open[node.tag].pop()
        del self.stack[position:]

    def _close_implied(self, tag: str) -> None:
        rule = _RULES.get(tag)
        if rule is None:
            return
        closes, boundary = rule
        top = max((self.open[t][-1] for t in closes if self.open.get(t)), default=0)
        if top and top > max((self.open[t][-1] for t in boundary if self.open.get(t)), default=0):
            self._pop_to(top)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self._counted(1 + len(attrs)):
            return
        self._close_implied(tag)
        node = Node(tag, {k: (v if v is not None else "") for k, v in attrs})
        if self._add(node) and tag not in VOID:
            self.open.setdefault(tag, []).append(len(self.stack))
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self._counted(1 + len(attrs)):
            return
        self._close_implied(tag)
        self._add(Node(tag, {k: (v if v is not None else "") for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        positions = self.open.get(tag)
        if self._counted() and positions:
            self._pop_to(positions[-1])
        # a stray end tag is ignored, as browsers do

    def handle_comment(self, data: str) -> None:
        self._counted()

    def handle_decl(self, decl: str) -> None:
        self._counted()

    def handle_pi(self, data: str) -> None:
        self._counted()

    def unknown_decl(self, data: str) -> None:
        self._counted()

    def handle_data(self, data: str) -> None:
        if not self._counted() or not data:
            return
        parent = self._parent()
        last = parent.children[-1] if parent.children else None
        if last is not None and last is self._text:
            self._pieces.append(data)
            return
        if last is not None and last.tag == TEXT:  # a run continued after something that added no node
            self._flush()
            self._text, self._pieces = last, [last.text, data]
            return
        node = Node(TEXT)
        if self._add(node):
            self._text, self._pieces = node, [data]

    def finish(self) -> None:
        """End of input: what html.parser still holds is an unfinished construct or a text tail. An unfinished
        comment, tag or declaration is dropped (as HTML5 does at end of file), and so is the rest of an unclosed
        script or style (as html.parser's ``close`` does); anything else is text. (``close`` itself would re-scan
        an unfinished construct once per character after it: quadratic.)"""
        rest, self.rawdata = self.rawdata, ""
        if rest and not self.truncated and not self.cdata_elem and not re.match(r"<[a-zA-Z/!?]", rest):
            self.handle_data(html.unescape(rest))
        self._flush()
        self.stack = [self.document]
        self.open.clear()


@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed page: its document, its node count, and why a budget cut it ("" when none did)."""

    document: Node
    truncated: str
    nodes: int


def parse(markup: str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Parsed:
    """Parse ``markup`` within the budgets; every node numbered in document order (document = 1)."""
    builder = _TreeBuilder(max_nodes, max_depth)
    for start in range(0, len(markup), FEED_CHUNK):
        builder.feed(markup[start:start + FEED_CHUNK])
        if builder.truncated:
            break
        pending = builder.rawdata
        if len(pending) > MAX_TAG_CHARS and not builder.cdata_elem and re.match(r"<[a-zA-Z]", pending):
            builder.truncated = f"a tag longer than {MAX_TAG_CHARS >> 10} KiB"
            break
    builder.finish()
    for number, node in enumerate(builder.document.iter(), start=1):
        node.node_id = number
    return Parsed(builder.document, builder.truncated, builder.nodes)


def parse_html(markup: str) -> Node:
    """The document node of ``markup`` (see ``parse``)."""
    return parse(markup).document


def query_selector(root: Node, selector: str) -> Node | None:
    """The first descendant of ``root`` matching the CSS ``selector`` (``SelectorError`` if unsupported)."""
    return Selector(selector).first(root)


def query_selector_all(root: Node, selector: str) -> list[Node]:
    """Every descendant of ``root`` matching the CSS ``selector``, in document order."""
    return Selector(selector).all(root)


def page_title(document: Node) -> str:
    title = query_selector(document, "title")
    return " ".join(title.text_content().split()) if title is not None else ""


def body_of(document: Node) -> Node:
    return query_selector(document, "body") or document


# -- rendered text -------------------------------------------------------------------------------------------------

_SPACE = re.compile(r"[ \t\n\r\f]+")


def outer_text(node: Node) -> str:
    """The node's rendered text, like the DOM's ``innerText``/``outerText``: whitespace collapsed, block elements
    on their own lines, ``<br>`` a line break, table cells separated by tabs, script/style/head left out.
    Form fields contribute nothing (as in the DOM), except that the text of a field itself is its current value."""
    if node.tag in ("input", "textarea", "select"):
        return field_value(node)
    parts: list[str | int] = []  # strings, or ints = required line breaks
    stack: list[Node | str | int] = [node]  # nodes to enter; strings and ints to emit once their turn comes
    while stack:
        item = stack.pop()
        if not isinstance(item, Node):
            parts.append(item)
            continue
        n = item
        if n.tag == TEXT:
            text = _SPACE.sub(" ", n.text)
            if text:
                parts.append(text)
            continue
        if n.tag in NOT_RENDERED or "hidden" in n.attrs or n.tag in ("input", "textarea", "select", "option"):
            continue
        if n.tag == "br":
            parts.append("\n")
            continue
        breaks = 2 if n.tag == "p" else 1 if n.tag in BLOCK else 0
        if breaks:
            parts.append(breaks)
            stack.append(breaks)  # after the children
        last = n.children[-1] if n.children else None
        for child in reversed(n.children):
            if child.tag in ("td", "th") and child is not last:
                stack.append("\t")  # table cells are separated by tabs
            stack.append(child)

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


__all__ = [
    "BUTTON_TYPES", "DOCUMENT", "MAX_DEPTH", "MAX_NODES", "Node", "Parsed", "SUBMIT_TYPES", "Selector",
    "SelectorError", "TEXT", "TEXT_INPUT_TYPES", "body_of", "enclosing_form", "field_value", "form_fields",
    "input_type", "is_checked", "is_submit", "is_text_field", "option_label", "option_value", "options_of",
    "outer_text", "page_title", "parse", "parse_html", "query_selector", "query_selector_all", "selected_option"
]
