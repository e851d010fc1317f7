"""CSS selectors for the text browser's documents: the subset WebArena's locators use, matched in one pass.

Owns: ``Selector`` (tag, ``.class``, ``#id``, ``[attr]``, ``[attr="v"]``, compounds, descendant ``' '`` and child
``'>'`` combinators, comma groups) and ``SelectorError`` (anything else, or malformed; the message names the
selector). Matching carries, from each node to its children, which prefixes of each chain matched on the node or
above it, so ``all``/``first`` are one walk of the tree, O(nodes x compounds), whatever the combinators (no
backtracking over ancestors, which is exponential-ish on a deep tree).
Must never: walk a tree recursively, or change the nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ...errors import EnvsError
from .node import Node


class SelectorError(EnvsError, ValueError):
    """A CSS selector outside the supported subset (or malformed); the message names the selector."""


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
        self.final_mask = 0  # bits of each group's last compound (set by _steps)
        self.steps = self._steps()

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

    def _steps(self) -> list[tuple[int, str, _Compound, int]]:
        """Every compound of every group as (bit, combinator before it, compound, bit of the compound before)."""
        steps, bit = [], 0
        self.final_mask = 0
        for chain in self.groups:
            for index, (combinator, compound) in enumerate(chain):
                steps.append((bit, combinator, compound, bit - 1 if index else -1))
                bit += 1
            self.final_mask |= 1 << (bit - 1)
        return steps

    def _state(self, node: Node, parent_state: tuple[int, int]) -> tuple[int, int]:
        """(matched, seen) for ``node``: bit b of ``matched`` says the chain up to compound b matches with
        compound b on this node; of ``seen``, on this node or an ancestor. Each node's state comes from its
        parent's, so one pass over a tree matches every node: O(nodes x compounds), whatever the combinators."""
        parent_matched, parent_seen = parent_state
        matched = 0
        for bit, combinator, compound, before in self.steps:
            if combinator == ">":
                ok = parent_matched >> before & 1
            elif combinator:
                ok = parent_seen >> before & 1
            else:
                ok = 1
            if ok and compound.matches(node):
                matched |= 1 << bit
        return matched, parent_seen | matched

    def _state_of(self, node: Node) -> tuple[int, int]:
        state = (0, 0)
        for above in reversed([node, *node.ancestors()]):
            state = self._state(above, state)
        return state

    def matches(self, node: Node) -> bool:
        return bool(self._state_of(node)[0] & self.final_mask)

    def _matching(self, root: Node) -> Iterator[Node]:
        """Matching descendants of ``root`` in document order (its ancestors count for the combinators)."""
        state = self._state_of(root)
        stack = [(child, state) for child in reversed(root.children)]
        while stack:
            node, parent_state = stack.pop()
            if not node.is_element:
                continue
            own = self._state(node, parent_state)
            if own[0] & self.final_mask:
                yield node
            stack.extend((child, own) for child in reversed(node.children))

    def all(self, root: Node) -> list[Node]:
        """Matching descendants of ``root`` (not ``root`` itself, as ``querySelectorAll``), in document order."""
        return list(self._matching(root))

    def first(self, root: Node) -> Node | None:
        return next(self._matching(root), None)
