"""WebArena's id-based action language, as text and as tool calls.

Owns: the syntax, and nothing else: an action is its tool's name followed by the tool's arguments in square
brackets, in the order the schema declares them (``envs/webshop/tools.py``: which tools exist, their arguments,
types and defaults). ``click [12]``, ``type [7] [sony headphones] [1]`` (a bool is written 1 or 0, or
``[press_enter_after=0]``), ``scroll [down]``, ``stop [answer]``. A tool's one text argument is taken whole: it may
contain brackets, even ``] [`` (``type``'s text, ``goto``'s url, ``press``'s keys, ``stop``'s answer); arguments
after it with a default may be left out (``type [7] [text]``, ``stop``).
``parse_action`` (text -> the call in normal form, checked by the schema), ``format_action`` (its inverse:
``parse_action(format_action(c)) == c`` for every call in normal form) and ``validate_call`` (a policy may send tool
calls directly: the schema's check and normal form, ``type``'s ``press_enter_after`` defaulted to True as in
WebArena).
Every malformed action, of any size, raises ``ActionError`` naming the action and what is wrong, quickly: an action
longer than ``MAX_ACTION_CHARS`` is refused unread, an id or index has at most ten digits.
Must never: touch a browser; it only translates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec.inspect as mi

from ...records import ToolCall
from ...suites.base import ActionError
from ...suites.tools import MAX_INT, Arg, check_action_text
from ..tools import SCHEMA

VERBS = SCHEMA.names
_SEPARATOR = re.compile(r"\]\s*\[")
_VERB = re.compile(r"[A-Za-z_]+")
_MAX_DIGITS = len(str(MAX_INT))


@dataclass(frozen=True)
class _Layout:
    """How a tool's arguments are written: those before its one text argument, the text argument (taken whole),
    those after it (bracketed groups that may each be left out when they have a default)."""

    before: tuple[Arg, ...]
    text: Arg | None
    after: tuple[Arg, ...]

    @property
    def wanted(self) -> str:
        """The required arguments as an action writes them: ``[element_id] [text]``."""
        every = (*self.before, *((self.text,) if self.text is not None else ()), *self.after)
        return " ".join(f"[{a.name}]" for a in every if a.required)


def _layout(verb: str) -> _Layout:
    args = SCHEMA.args(verb)
    texts = [i for i, a in enumerate(args) if isinstance(a.type, mi.StrType)]
    if len(texts) > 1:
        raise ValueError(f"{verb}: the action language takes whole at most one text argument, the schema has "
                         f"{[args[i].name for i in texts]}")
    if not texts:
        return _Layout(before=args, text=None, after=())
    return _Layout(before=args[:texts[0]], text=args[texts[0]], after=args[texts[0] + 1:])


_LAYOUTS = {verb: _layout(verb) for verb in VERBS}


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _fail(action: str, what: str) -> ActionError:
    return ActionError(f"invalid action {_short(action)!r}: {what}")


def _integer(action: str, raw: str, what: str) -> int:
    text = raw.strip()
    if not text.isdigit() or not text.isascii():
        raise _fail(action, f"{what} must be a non-negative integer, got [{_short(raw, 40)}]")
    if len(text) > _MAX_DIGITS:  # int() of thousands of digits is slow, and refused past 4300
        raise _fail(action, f"{what} must be a non-negative integer of at most {_MAX_DIGITS} digits, got "
                            f"{len(text)} digits")
    return int(text)


def _value(action: str, verb: str, arg: Arg, raw: str) -> Any:
    """A bracketed group as ``arg``'s value; ``None`` when it is not one (only a defaulted argument after the text
    may be absent, its group then belongs to the text)."""
    t = arg.type
    word = raw.strip().lower().removeprefix(f"{arg.name}=").strip()
    if isinstance(t, mi.IntType):
        return _integer(action, raw, "the " + arg.name.replace("_", " "))
    if isinstance(t, mi.BoolType):
        return {"1": True, "0": False}.get(word)
    if isinstance(t, mi.LiteralType):
        return next((c for c in arg.choices or t.values if str(c).lower() == word), None)
    raise ValueError(f"{verb}: the action language cannot write {arg.name} ({t!r})")


def _required(action: str, verb: str, arg: Arg, raw: str) -> Any:
    value = _value(action, verb, arg, raw)
    if value is None:
        choices = " or ".join(str(c) for c in arg.choices) or "1 or 0"
        raise _fail(action, f"{verb} {arg.name} must be {choices}, got [{_short(raw, 40)}]")
    return value


def _groups(action: str, rest: str) -> list[str]:
    """The bracketed arguments after the verb, ``[a] [b]`` -> ["a", "b"]."""
    if not rest:
        return []
    if not (rest.startswith("[") and rest.endswith("]")):
        raise _fail(action, "arguments must be written in square brackets, like [12]")
    return _SEPARATOR.split(rest[1:-1])


def _positional(action: str, verb: str, rest: str, layout: _Layout) -> dict[str, Any]:
    groups = _groups(action, rest)
    if not layout.before and groups == [""]:
        groups = []  # ``go_back []`` is tolerated
    if len(groups) < sum(a.required for a in layout.before):
        raise _fail(action, f"{verb} needs {layout.wanted}")
    if len(groups) > len(layout.before):
        raise _fail(action, f"{verb} takes {len(layout.before)} argument(s), got {len(groups)}")
    return {arg.name: _required(action, verb, arg, raw) for arg, raw in zip(layout.before, groups, strict=False)}


def _with_text(action: str, verb: str, rest: str, layout: _Layout) -> dict[str, Any]:
    text = layout.text
    assert text is not None
    if not rest:
        if not layout.wanted:
            return {}  # ``stop``: every argument has its default
        raise _fail(action, f"{verb} needs {layout.wanted}")
    if not (rest.startswith("[") and rest.endswith("]")):
        raise _fail(action, f"{verb} takes its arguments in square brackets, like {verb} {layout.wanted}")
    body = rest[1:-1]
    args: dict[str, Any] = {}
    for arg in layout.before:
        sep = _SEPARATOR.search(body)
        if sep is None:
            raise _fail(action, f"{verb} needs {layout.wanted}")
        args[arg.name] = _required(action, verb, arg, body[:sep.start()])
        body = body[sep.end():]
    for arg in reversed(layout.after):
        separators = list(_SEPARATOR.finditer(body))
        last = separators[-1] if separators else None
        value = _value(action, verb, arg, body[last.end():]) if last is not None else None
        if value is not None:
            args[arg.name], body = value, body[:last.start()]
        elif arg.required:
            raise _fail(action, f"{verb} needs {layout.wanted}")
    value = body.strip() if text.trimmed else body
    if text.trimmed and not value:
        raise _fail(action, f"{verb} needs a non-empty [{text.name}]")
    args[text.name] = value
    return args


def parse_action(text: str) -> ToolCall:
    """One WebArena action string as a tool call in normal form; ``ActionError`` naming the action and the problem
    otherwise."""
    action = check_action_text(text).strip()
    if not action:
        raise ActionError("invalid action '': empty; expected one of " + ", ".join(VERBS))
    match = _VERB.match(action)
    verb = match.group(0).lower() if match else ""
    if verb not in SCHEMA:
        head = action.split("[")[0].split()
        raise _fail(action, f"unknown action {_short(head[0] if head else action[:20], 40)!r}; expected one of "
                            f"{', '.join(VERBS)}")
    rest = action[len(verb):].strip()
    layout = _LAYOUTS[verb]
    args = _positional(action, verb, rest, layout) if layout.text is None else _with_text(action, verb, rest, layout)
    try:
        return SCHEMA.normalize(ToolCall(name=verb, args=args))
    except ActionError as exc:
        raise _fail(action, str(exc)) from exc


def validate_call(call: ToolCall) -> ToolCall:
    """Check a tool call's name and arguments against the schema; the call in normal form (defaults filled in:
    ``press_enter_after`` True, ``answer`` "")."""
    return SCHEMA.normalize(call)


def format_action(call: ToolCall) -> str:
    """The action string of a (valid) call; ``parse_action`` gives its normal form back."""
    call = validate_call(call)
    groups = [f"[{int(v) if isinstance(v, bool) else v}]" for v in (call.args[a.name] for a in SCHEMA.args(call.name))]
    return " ".join([call.name, *groups])
