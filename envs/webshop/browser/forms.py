"""HTML forms of the text browser's documents: field kinds, current values and a form's data set.

Owns: what kind of field a node is (``input_type``, ``is_text_field``, ``is_submit``), its current value (the
user's, else the markup's default), a select's options and chosen option, the form a field belongs to, and the
data set a submission sends (``form_fields``). Every helper walks iteratively and at most once over a tree.
Must never: change the nodes (typed values are set by the browser), or do I/O.
"""

from __future__ import annotations

from .node import Node

SUBMIT_TYPES = frozenset({"submit", "image"})
BUTTON_TYPES = frozenset({"submit", "image", "button", "reset"})
TEXT_INPUT_TYPES = frozenset({"", "text", "search", "email", "password", "number", "tel", "url", "date", "month",
                              "week", "time", "datetime-local", "color"})
OPTION_TEXT_NODES = 64  # nodes of an option read for its text (real options have one text node)


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
        found = next((n for n in node.root().elements() if n.tag == "form" and n.attrs.get("id") == owner), None)
        if found is not None:
            return found
    return node.closest("form")


def options_of(select: Node) -> list[Node]:
    """The select's options in document order; a select nested in it (never made by a browser's parser) keeps
    its own, so listing every select's options walks each node once."""
    found, stack = [], list(reversed(select.children))
    while stack:
        node = stack.pop()
        if node.tag == "option":
            found.append(node)
        if node.tag != "select":
            stack.extend(reversed(node.children))
    return found


def option_label(option: Node) -> str:
    """The option's text, whitespace collapsed, from at most ``OPTION_TEXT_NODES`` of its nodes (an option holds
    one text run; a hostile page can nest whole subtrees in one, and a select's options are all looked at)."""
    parts, stack, seen = [], [iter((option,))], 0
    while stack and seen < OPTION_TEXT_NODES:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            continue
        seen += 1
        if node.tag == "#text":
            parts.append(node.text)
        elif node.children:
            stack.append(iter(node.children))
    return " ".join("".join(parts).split())


def option_value(option: Node) -> str:
    return option.attrs["value"] if "value" in option.attrs else option_label(option)


def selected_option(select: Node, options: list[Node] | None = None) -> Node | None:
    """The chosen option (``options``: the select's, if already listed)."""
    options = options_of(select) if options is None else options
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
    checkboxes and radios only when checked; a submit button only when it is the ``submitter``. One walk of the
    document, carrying the nearest enclosing form down (``enclosing_form`` per field would climb per field)."""
    root = form.root()
    forms_by_id: dict[str, Node] = {}
    for node in root.elements():
        if node.tag == "form" and node.attrs.get("id"):
            forms_by_id.setdefault(node.attrs["id"], node)
    form_id = form.attrs.get("id")
    fields = []
    stack: list[tuple[Node, Node | None]] = [(root, None)]
    while stack:
        node, nearest = stack.pop()
        stack.extend((child, node if node.tag == "form" else nearest) for child in reversed(node.children))
        if node.tag not in ("input", "textarea", "select", "button"):
            continue
        named_owner = node.attrs.get("form")
        owner = forms_by_id.get(named_owner, nearest) if named_owner else nearest
        if owner is not form and not (form_id and named_owner == form_id):
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
