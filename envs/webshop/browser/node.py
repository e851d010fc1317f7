"""The node of the text browser's documents: one element, text node or the document, and the tree they make.

Owns: ``Node`` (its tag, attributes, children and parent; form state such as a typed value lives on the node), the
tree's walks (``iter``, ``elements``, ``ancestors``, ``closest``, ``find_by_id``: none recursive), ``TEXT`` and
``DOCUMENT``, and pickling a tree flat (a restore checkpoint of a deep page does not recurse). The parser and the
rendered text are ``dom.py``'s, selectors ``css.py``'s, form helpers ``forms.py``'s: each imports this module.
Must never: import those modules, do I/O, or know about pages; node ids are document order only.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

TEXT = "#text"
DOCUMENT = "#document"


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

    def find_by_id(self, node_id: int) -> Node | None:
        """The node numbered ``node_id`` in this subtree. Ids are document order, so each level's children are
        sorted by id and the target lies under the last child whose id is not past it: a descent, not a scan.
        (A tree that was never numbered, ids all 0, is scanned.)"""
        if self.node_id <= 0 or node_id <= 0:
            return next((n for n in self.iter() if n.node_id == node_id), None)
        node = self
        while node.node_id != node_id:
            at = bisect.bisect_right(node.children, node_id, key=_node_id) - 1
            if at < 0:
                return None
            node = node.children[at]
        return node

    def root(self) -> Node:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled flat: the root as a list of node records (no recursion, whatever the depth); any other node as
        (its root, its position there), so every reference to a node unpickles to the same node of one tree."""
        root = self.root()
        if root is self:
            return _rebuild, (_flatten(self),)
        numbered = root.node_id == 1 and self.node_id > 0
        key = self.node_id if numbered else next(i for i, n in enumerate(root.iter()) if n is self)
        return _descendant, (root, numbered, key)


def _node_id(node: Node) -> int:
    return node.node_id


def _flatten(root: Node) -> list[tuple[object, ...]]:
    """Every node of ``root``'s tree in document order: (tag, attrs, text, id, value, checked, parent position)."""
    position: dict[int, int] = {}
    flat: list[tuple[object, ...]] = []
    for index, node in enumerate(root.iter()):
        position[id(node)] = index
        parent = position[id(node.parent)] if node.parent is not None and node is not root else -1
        flat.append((node.tag, node.attrs, node.text, node.node_id, node.value, node.checked, parent))
    return flat


def _rebuild(flat: list[tuple[object, ...]]) -> Node:
    nodes: list[Node] = []
    for tag, attrs, text, node_id, value, checked, parent in flat:
        node = Node(tag, attrs, text)  # type: ignore[arg-type]
        node.node_id, node.value, node.checked = node_id, value, checked  # type: ignore[assignment]
        if parent >= 0:  # type: ignore[operator]
            nodes[parent].append(node)  # type: ignore[index]
        nodes.append(node)
    return nodes[0]


def _descendant(root: Node, numbered: bool, key: int) -> Node:
    found = root.find_by_id(key) if numbered else next(n for i, n in enumerate(root.iter()) if i == key)
    assert found is not None, f"node {key} is not in its pickled tree"
    return found
