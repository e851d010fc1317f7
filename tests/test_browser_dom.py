"""The document model (dom.py, css.py, forms.py) and the accessibility tree's bounds: selectors, outer text,
forms, the parser's implied end tags, and what holds on any input: chunked parsing is the same parse, the depth
and node budgets, unfinished constructs at the end, no recursion on deep trees, selectors matched in one pass (the
same matches as backtracking), ids found by descent, deep trees pickled flat, names and indentation bounded."""

from __future__ import annotations

import pickle
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.envs.webshop.browser import accessibility, dom
from bunshin.envs.webshop.browser.dom import SelectorError, form_fields, outer_text, parse_html

DOC = """<html><head><title>T</title><style>p { color: red }</style></head><body>
<div id="main" class="page main"><ol class="items"><li class="item product"><a class="link" href="/a">A <b>bold</b></a>
<span class="price">$1.00</span><li class="item product special"><a class="link" href="/b">B</a><span class="price">$2.00
</span></ol><p>First paragraph<br>second line<p>Another <img src=x alt="pic"> paragraph</div>
<table><tr><th>K</th><td>V</td></tr><tr><th>K2</th><td>V2</td></table>
<form id="f" method="post"><input type="hidden" name="h" value="1"><input name="t" value="x">
<input type="checkbox" name="c"><select name="s"><option>one<option selected>two</select>
<textarea name="ta">
hello</textarea><input type="submit" name="go" value="Go"><input name="disabled" disabled value="d"></form>
<input form="f" name="outside" value="o">
</body></html>"""


def test_dom_selectors_and_text() -> None:
    d = parse_html(DOC)
    assert d.node_id == 1 and [n.node_id for n in d.iter()] == list(range(1, len(list(d.iter())) + 1))
    assert [outer_text(n) for n in dom.query_selector_all(d, "li.item.product > a.link")] == ["A bold", "B"]
    assert [n.text_content() for n in dom.query_selector_all(d, ".special .price")] \
        == ["$2.00\n"]
    assert len(dom.query_selector_all(d, "ol li")) == 2  # the unclosed <li> was closed by the next one
    assert len(dom.query_selector_all(d, "div#main > ol > li")) == 2 and dom.query_selector_all(d, "body > li") == []
    assert len(dom.query_selector_all(d, "a[href]")) == 2 and outer_text(dom.query_selector(d, "a[href='/b']")) == "B"
    assert dom.query_selector(d, "[href=\"/a\"]").text_content() == "A bold"
    assert len(dom.query_selector_all(d, ".price, a")) == 4
    assert dom.query_selector(d, "*.page.main#main") is dom.query_selector(d, "#main")
    assert outer_text(dom.query_selector(d, "p")) == "First paragraph\nsecond line"  # unclosed <p> closed by <p>
    assert outer_text(dom.query_selector(d, "table")) == "K\tV\nK2\tV2"
    assert outer_text(dom.query_selector(d, "#main")) == "A bold $1.00\nB$2.00\n\nFirst paragraph\nsecond line\n\n" \
                                                    "Another paragraph"
    for bad in ("a:hover", "a + b", "a ~ b", "[href^='/']", "div >", "> div", "", "a,,b", "::before"):
        with pytest.raises(SelectorError) as info:
            dom.query_selector_all(d, bad)
        assert repr(bad) in str(info.value)
    form = dom.query_selector(d, "#f")
    assert form_fields(form) == [("h", "1"), ("t", "x"), ("s", "two"), ("ta", "hello"), ("outside", "o")]
    dom.query_selector(d, "[name=t]").value = "typed"
    dom.query_selector(d, "[name=c]").checked = True
    submit = dom.query_selector(d, "[type=submit]")
    assert form_fields(form, submit) == [("h", "1"), ("t", "typed"), ("c", "on"), ("s", "two"), ("ta", "hello"),
                                         ("go", "Go"), ("outside", "o")]


def shape(node: dom.Node) -> str:
    """The tree as nested tags, text as '"text"'."""
    if node.tag == dom.TEXT:
        return repr(node.text)
    inner = " ".join(shape(c) for c in node.children)
    return f"{node.tag}({inner})" if inner else node.tag


@pytest.mark.parametrize("markup, expected", [
    ("<ul><li>a<li>b</ul>", "ul(li('a') li('b'))"),
    ("<ul><li>a<ul><li>b</ul>c</ul>", "ul(li('a' ul(li('b')) 'c'))"),  # the inner list shields the outer item
    ("<p>a<p>b<div>c</div>", "p('a') p('b') div('c')"),
    ("<p>a<button>b<p>c</button>", "p('a' button('b' p('c')))"),  # a button shields the paragraph
    ("<table><tr><td>a<td>b</tr><tr><td>c</table>", "table(tr(td('a') td('b')) tr(td('c')))"),
    ("<select><option>a<option>b<optgroup><option>c</select>", "select(option('a') option('b') optgroup(option('c')))"),
    ("<dl><dt>a<dd>b<dt>c</dl>", "dl(dt('a') dd('b') dt('c'))"),
    ("<select><option>a<select><option>b", "select(option('a')) select(option('b'))"),  # selects never nest
    ("<div><span>a</div>b", "div(span('a')) 'b'"),  # an end tag closes what is open inside it
    ("a</x>b<!-- c -->c", "'abc'"),  # text runs continue across stray end tags and comments
    ("<p>a<!-- unfinished", "p('a')"),  # unfinished at the end: dropped, as HTML5 does
    ("<p>a<b title='x", "p('a')"),
    ("<p>a &amp", "p('a &')"),
    ("<p>a<script>if (a < b) {", "p('a' script)"),
])
def test_implied_end_tags_and_end_of_file(markup: str, expected: str) -> None:
    assert " ".join(shape(c) for c in parse_html(markup).children) == expected


SOUP_TAGS = ["div", "p", "li", "ul", "option", "select", "tr", "td", "th", "table", "dt", "dd", "button", "span",
             "a", "br", "img", "script", "textarea", "form", "input", "label", "h1"]
soup = st.lists(st.one_of(
    st.builds(lambda t, c: f"<{t} class=c{c}>", st.sampled_from(SOUP_TAGS), st.integers(0, 2)),
    st.builds(lambda t: f"</{t}>", st.sampled_from(SOUP_TAGS)),
    st.sampled_from(["x", " y ", "&amp;", "z\n", "<!-- c -->", "&lt;", "<", "&"]),
), max_size=80).map("".join)


@settings(max_examples=200, deadline=None)
@given(soup, st.integers(1, 40))
def test_chunked_parsing_is_the_same_parse(markup: str, chunk: int) -> None:
    whole = dom.parse(markup)
    original = dom.FEED_CHUNK
    dom.FEED_CHUNK = chunk
    try:
        pieces = dom.parse(markup)
    finally:
        dom.FEED_CHUNK = original
    flat = lambda p: [(n.tag, n.attrs, n.text, n.node_id, n.parent.node_id if n.parent else 0)  # noqa: E731
                      for n in p.document.iter()]
    assert flat(pieces) == flat(whole)


def test_depth_is_capped_and_end_tags_still_match() -> None:
    deep = "<div>" * 2000 + "bottom" + "</div>" * 2000 + "<p>after</p>"
    started = time.monotonic()
    d = parse_html(deep)
    assert time.monotonic() - started < 5
    depth = {id(d): 0}
    for node in d.iter():
        if node.parent is not None:
            depth[id(node)] = depth[id(node.parent)] + 1
    assert max(depth.values()) == dom.MAX_DEPTH
    assert outer_text(dom.query_selector(d, "p")) == "after" and dom.query_selector(d, "p").parent is d  # all divs closed
    assert "bottom" in outer_text(d)


def test_node_event_and_tag_budgets_truncate() -> None:
    parsed = dom.parse("<div>" * 200_000)  # the probe's page: was minutes, quadratic
    assert parsed.nodes == dom.MAX_NODES and "more than 50,000 elements" in parsed.truncated
    assert sum(1 for _ in parsed.document.iter()) == dom.MAX_NODES
    parsed = dom.parse("a</x>" * 300_000)  # no nodes, but an event each
    assert "tags and text runs" in parsed.truncated and len(parsed.document.children) == 1
    parsed = dom.parse("<p>kept</p><a " + "b=c " * 100_000)
    assert "a tag longer than 256 KiB" in parsed.truncated and outer_text(parsed.document) == "kept"
    assert dom.parse("<p>" + "x" * 1_000_000 + "</p>").truncated == ""  # long text is no tag


def chain(depth: int, tag: str = "a", leaf: str = "end") -> dom.Node:
    """A tree far deeper than the parser makes (no recursion limit may be met on it)."""
    root = node = dom.Node(dom.DOCUMENT)
    for i in range(depth):
        child = dom.Node(tag, {"href": f"/{i}", "class": f"c{i % 3}"})
        node.append(dom.Node(dom.TEXT, text=f"t{i} "))
        node.append(child)
        node = child
    node.append(dom.Node(dom.TEXT, text=leaf))
    for number, n in enumerate(root.iter(), start=1):
        n.node_id = number
    return root


def test_deep_trees_are_walked_without_recursion() -> None:
    root = chain(20_000)
    assert outer_text(root).endswith("t19999 end") and root.text_content().endswith("end")
    assert len(dom.query_selector_all(root, "a a a .c1")) > 6000
    last = max(root.iter(), key=lambda n: n.node_id)
    assert root.find_by_id(last.node_id) is last and root.find_by_id(10**9) is None
    copy = pickle.loads(pickle.dumps(root, protocol=5))
    assert [(n.tag, n.node_id, n.text) for n in copy.iter()] == [(n.tag, n.node_id, n.text) for n in root.iter()]
    tree = accessibility.build(root, "deep")
    assert max(line.depth for line in tree.lines) == accessibility.MAX_INDENT
    assert all(len(line.name) <= accessibility.MAX_NAME_CHARS for line in tree.lines)


def naive_matches(selector: dom.Selector, node: dom.Node) -> bool:
    """The textbook backtracking matcher (exponential-ish on deep trees): the oracle for the one-pass one."""
    def match(n: dom.Node, chain: list, index: int) -> bool:
        combinator, compound = chain[index]
        if not compound.matches(n):
            return False
        if index == 0:
            return True
        if combinator == ">":
            return n.parent is not None and match(n.parent, chain, index - 1)
        return any(match(a, chain, index - 1) for a in n.ancestors())
    return any(match(node, group, len(group) - 1) for group in selector.groups)


def random_tree(rng: random.Random, size: int) -> dom.Node:
    root = dom.Node(dom.DOCUMENT)
    nodes = [root]
    for _ in range(size):
        parent = rng.choice(nodes[-8:] + nodes[:2])  # mostly deep, sometimes wide
        child = dom.Node(rng.choice("abc"), {"class": rng.choice(["x", "y", "x y"])})
        parent.append(child)
        nodes.append(child)
    return root


def test_selectors_match_as_backtracking_does_in_one_pass() -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    selectors = ["a b", "a > b", "a > b c", "a b > c", "a .x > b .y c", ".x.y", "a > a > a", "b c, a > c",
                 "* > a b", "c * c"]
    for _ in range(30):
        root = random_tree(rng, 120)
        for text in selectors:
            selector = dom.Selector(text)
            expected = [n for n in root.iter() if n is not root and naive_matches(selector, n)]
            assert selector.all(root) == expected, (seed, text)
            assert selector.first(root) == (expected[0] if expected else None)
            for sub in rng.sample(list(root.iter()), 5):  # from a subtree: ancestors above it still count
                assert selector.all(sub) == [n for n in expected if n is not sub and sub in n.ancestors()]
    deep = chain(5000)
    started = time.monotonic()
    assert len(dom.Selector("a a a a a a b, a > a .c2 a").all(deep)) > 1000
    assert time.monotonic() - started < 5  # backtracking takes hours here


def test_accessibility_names_are_cut_and_named_content_is_bounded() -> None:
    page = parse_html("<html><head><title>" + "T" * 5000 + "</title></head><body>"
                      + "<p>" + "word " * 50_000 + "</p><a href=/x aria-label='" + "z" * 5000 + "'>x</a>"
                      + "<input value='" + "v" * 5000 + "'>" + "</body></html>")
    tree = accessibility.build(page, dom.page_title(page))
    assert all(len(line.name) <= accessibility.MAX_NAME_CHARS for line in (tree.root, *tree.lines))
    assert tree.lines[0].name.endswith("\u2026") and tree.lines[0].role == "StaticText"
    # nested links: each link's name reads its descendants; one budget bounds them all
    nested = parse_html("<a href=x>" * 500 + "text " * 2000 + "</a>" * 500)
    started = time.monotonic()
    tree = accessibility.build(nested, "")
    assert time.monotonic() - started < 5
    assert len(tree.lines) == 500 and tree.lines[0].name.startswith("text text")
    # a wide row of headers: one look at the row, not one per cell
    wide = parse_html("<table><tr>" + "<th>h</th>" * 20_000 + "</tr></table>")
    started = time.monotonic()
    assert {line.role for line in accessibility.build(wide, "").lines} == {"table", "row", "columnheader"}
    assert time.monotonic() - started < 5
