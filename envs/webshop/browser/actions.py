"""WebArena's id-based action language, as text and as tool calls.

Owns: ``parse_action`` (``click [12]``, ``type [7] [sony headphones] [1]``, ``scroll [down]``, ``stop [answer]``...
to a ``ToolCall``), ``format_action`` (its inverse: ``parse_action(format_action(c)) == c`` for every valid call)
and ``validate_call`` (a policy may send tool calls directly: checks the name and the arguments and returns the
canonical call, ``type``'s ``press_enter_after`` filled in with WebArena's default, True).
Every malformed action raises ``ActionError`` naming the action and what is wrong.
Must never: touch a browser; it only translates.

Tool calls (name -> args):
``click``/``hover`` {element_id: int}; ``type`` {element_id: int, text: str, press_enter_after: bool};
``press`` {key_comb: str}; ``scroll`` {direction: "up"|"down"}; ``new_tab`` {}; ``tab_focus`` {tab_index: int};
``close_tab`` {}; ``goto`` {url: str}; ``go_back`` {}; ``go_forward`` {}; ``stop`` {answer: str}.
"""

from __future__ import annotations

import re
from typing import Any

from ...records import ToolCall
from ...suites.base import ActionError

ARGS: dict[str, tuple[str, ...]] = {
    "click": ("element_id",),
    "hover": ("element_id",),
    "type": ("element_id", "text", "press_enter_after"),
    "press": ("key_comb",),
    "scroll": ("direction",),
    "new_tab": (),
    "tab_focus": ("tab_index",),
    "close_tab": (),
    "goto": ("url",),
    "go_back": (),
    "go_forward": (),
    "stop": ("answer",),
}
VERBS = tuple(ARGS)
DIRECTIONS = ("up", "down")
_SEPARATOR = re.compile(r"\]\s*\[")


def _fail(action: str, what: str) -> ActionError:
    shown = action if len(action) <= 120 else action[:117] + "..."
    return ActionError(f"invalid action {shown!r}: {what}")


def _integer(action: str, raw: str, what: str) -> int:
    text = raw.strip()
    if not text.isdigit() or not text.isascii():
        raise _fail(action, f"{what} must be a non-negative integer, got [{raw}]")
    return int(text)


def _groups(action: str, rest: str) -> list[str]:
    """The bracketed arguments after the verb, ``[a] [b]`` -> ["a", "b"]; a group may itself contain brackets
    except the sequence ``] [`` (only the last argument of ``type``, ``goto``, ``press`` and ``stop`` is taken
    whole)."""
    if not rest:
        return []
    if not (rest.startswith("[") and rest.endswith("]")):
        raise _fail(action, "arguments must be written in square brackets, like [12]")
    return _SEPARATOR.split(rest[1:-1])


def parse_action(text: str) -> ToolCall:
    """One WebArena action string as a tool call; ``ActionError`` naming the action and the problem otherwise."""
    if not isinstance(text, str):
        raise ActionError(f"invalid action {text!r}: not a string")
    action = text.strip()
    if not action:
        raise ActionError("invalid action '': empty; expected one of " + ", ".join(VERBS))
    match = re.match(r"[A-Za-z_]+", action)
    verb = match.group(0).lower() if match else ""
    if verb not in ARGS:
        word = action.split("[")[0].split()[0] if action.split("[")[0].split() else action[:20]
        raise _fail(action, f"unknown action {word!r}; expected one of {', '.join(VERBS)}")
    rest = action[len(verb):].strip()

    if verb in ("goto", "press", "stop"):  # one argument taken whole: it may contain brackets
        key = ARGS[verb][0]
        if not rest:
            if verb == "stop":
                return ToolCall(name="stop", args={"answer": ""})
            raise _fail(action, f"{verb} needs [{key}]")
        if not (rest.startswith("[") and rest.endswith("]")):
            raise _fail(action, f"{verb} takes one argument in square brackets, like {verb} [{key}]")
        value = rest[1:-1]
        if verb != "stop" and not value.strip():
            raise _fail(action, f"{verb} needs a non-empty [{key}]")
        return validate_call(ToolCall(name=verb, args={key: value if verb == "stop" else value.strip()}))

    if verb == "type":
        if not rest.startswith("[") or not rest.endswith("]"):
            raise _fail(action, "type takes [id] [text] and optionally [press_enter_after=0|1]")
        first = _SEPARATOR.search(rest)
        if first is None:
            raise _fail(action, "type needs [id] [text]")
        element_id = _integer(action, rest[1:first.start()], "the element id")
        body = rest[first.end():-1]
        press = True
        last = None
        for last in _SEPARATOR.finditer(body):
            pass
        if last is not None:
            flag = body[last.end():].strip().lower().removeprefix("press_enter_after=").strip()
            if flag in ("0", "1"):
                press, body = flag == "1", body[:last.start()]
        return ToolCall(name="type", args={"element_id": element_id, "text": body, "press_enter_after": press})

    groups = _groups(action, rest)
    names = ARGS[verb]
    if not names and groups == [""]:
        groups = []  # ``go_back []`` is tolerated
    if len(groups) < len(names):
        wanted = " ".join(f"[{n}]" for n in names)
        raise _fail(action, f"{verb} needs {wanted}")
    if len(groups) > len(names):
        raise _fail(action, f"{verb} takes {len(names)} argument(s), got {len(groups)}")
    if verb in ("click", "hover"):
        return ToolCall(name=verb, args={"element_id": _integer(action, groups[0], "the element id")})
    if verb == "tab_focus":
        return ToolCall(name=verb, args={"tab_index": _integer(action, groups[0], "the tab index")})
    if verb == "scroll":
        direction = groups[0].strip().lower().removeprefix("direction=").strip()
        if direction not in DIRECTIONS:
            raise _fail(action, f"scroll direction must be up or down, got [{groups[0]}]")
        return ToolCall(name="scroll", args={"direction": direction})
    return ToolCall(name=verb, args={})


def _check_type(call: ToolCall, key: str, value: Any, kind: type) -> None:
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    else:
        ok = isinstance(value, kind)
    if not ok:
        wanted = "a non-negative int" if kind is int else kind.__name__
        raise ActionError(f"invalid {call.name} call: {key} must be {wanted}, got {value!r}")


def validate_call(call: ToolCall) -> ToolCall:
    """Check a tool call's name and arguments; the canonical call (``press_enter_after`` defaulted to True)."""
    if call.name not in ARGS:
        raise ActionError(f"invalid action: unknown tool {call.name!r}; expected one of {', '.join(VERBS)}")
    args = dict(call.args)
    if call.name == "type":
        args.setdefault("press_enter_after", True)
    if call.name == "stop":
        args.setdefault("answer", "")
    wanted = set(ARGS[call.name])
    if set(args) != wanted:
        missing, extra = sorted(wanted - set(args)), sorted(set(args) - wanted)
        detail = "; ".join([f"missing {missing}"] * bool(missing) + [f"unexpected {extra}"] * bool(extra))
        raise ActionError(f"invalid {call.name} call: {detail} (expects {sorted(wanted) or 'no arguments'})")
    for key, value in args.items():
        if key in ("element_id", "tab_index"):
            _check_type(call, key, value, int)
        elif key == "press_enter_after":
            _check_type(call, key, value, bool)
        else:
            _check_type(call, key, value, str)
    if call.name == "scroll" and args["direction"] not in DIRECTIONS:
        raise ActionError(f"invalid scroll call: direction must be 'up' or 'down', got {args['direction']!r}")
    if call.name in ("goto", "press") and (not args[ARGS[call.name][0]].strip()
                                           or args[ARGS[call.name][0]] != args[ARGS[call.name][0]].strip()):
        raise ActionError(f"invalid {call.name} call: {ARGS[call.name][0]} must be non-empty with no surrounding "
                          f"whitespace, got {args[ARGS[call.name][0]]!r}")
    return call if args == call.args else ToolCall(name=call.name, args=args)


def format_action(call: ToolCall) -> str:
    """The action string of a (valid) call; ``parse_action`` gives the canonical call back."""
    call = validate_call(call)
    a = call.args
    if call.name in ("click", "hover"):
        return f"{call.name} [{a['element_id']}]"
    if call.name == "type":
        return f"type [{a['element_id']}] [{a['text']}] [{int(a['press_enter_after'])}]"
    if call.name == "tab_focus":
        return f"tab_focus [{a['tab_index']}]"
    if call.name in ("press", "scroll", "goto", "stop"):
        return f"{call.name} [{a[ARGS[call.name][0]]}]"
    return call.name
