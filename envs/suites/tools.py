"""A suite's agent tools written once, as msgspec Structs, and everything derived from them.

Owns: ``ToolArgs`` (the base of one tool's arguments: a frozen, keyword-only Struct that refuses unknown fields; its
fields are the arguments with their types, defaults and ``Meta`` constraints, its docstring is the description a
model sees), ``ToolSchema`` (tool name -> Struct: checking a call, its normal form, OpenAI function definitions, the
one-line-per-tool listing a prompt shows), ``Trimmed`` (a non-empty string without surrounding whitespace), the
bounds every suite's action text keeps (``MAX_ACTION_CHARS``; ``MAX_INT`` for ids, lines and counts).

Normal form: ``normalize(call)`` is the call with every default filled in and every value of its declared type (an
int where a float is declared becomes a float), so two spellings of one call have one ``canonical`` key; calls that
differ in any argument keep different keys.

Must never: accept a call its Struct refuses, or fail with anything but the suite's ``ActionError`` (naming the tool
and the argument) on an agent's input, however malformed; list a tool whose name starts with ``_`` (a suite's
internal tools are not the agent's).
"""

from __future__ import annotations

import copy
import inspect
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi

from ..records import ToolCall
from .errors import ActionError

__all__ = ["MAX_ACTION_CHARS", "MAX_INT", "Arg", "ToolArgs", "ToolSchema", "Trimmed", "check_action_text"]

MAX_ACTION_CHARS = 64 << 10  # an action longer than this is refused before it is parsed
MAX_INT = 2**31 - 1  # ids, line numbers and counts are small: a cap, not a rule a model needs to read

Trimmed = Annotated[str, msgspec.Meta(min_length=1, extra={"trimmed": True})]

_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")  # what OpenAI and vLLM accept as a function name
_AT_FIELD = re.compile(r"(?P<what>.*) - at `\$\.(?P<arg>[^`\[]+)(?P<deeper>[^`]*)`", re.S)
_MISSING = re.compile(r"Object missing required field `(?P<arg>.*)`", re.S)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<arg>.*)`", re.S)
_NOT_OBJECT = re.compile(r"Expected `object`, got `(?P<got>\w+)`")


def check_action_text(text: object) -> str:
    """``text`` if it is an action text a parser may look at: a string of at most ``MAX_ACTION_CHARS``."""
    if not isinstance(text, str):
        raise ActionError(f"an action is text, got {type(text).__name__}")
    if len(text) > MAX_ACTION_CHARS:
        raise ActionError(f"the action is {len(text)} characters long; at most {MAX_ACTION_CHARS} are accepted")
    return text


class ToolArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The arguments of one tool. Subclasses say ``kw_only=True`` again (msgspec applies it per class), so a
    required argument may follow one with a default; ``__post_init__`` may refuse a value with ``ValueError`` whose
    message starts with the argument's name."""


@dataclass(frozen=True)
class Arg:
    """One argument as the schema sees it: the msgspec type (``Metadata`` unwrapped), the default (``NODEFAULT``
    when required), its description, and the ``Trimmed`` flag."""

    name: str
    type: mi.Type
    required: bool
    default: Any
    description: str
    trimmed: bool
    choices: tuple[Any, ...] = ()  # a Literal's values in the order written (msgspec sorts them)


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value) if not isinstance(value, str) or len(value) <= 4 * limit else repr(value[:2 * limit])
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _bounds(t: mi.IntType | mi.FloatType, *, cap: bool = False) -> str:
    """``in (0, 300]``, ``>= 1``, ``''``; the ``MAX_INT`` cap only when ``cap``."""
    low = f"[{_num(t.ge)}" if t.ge is not None else f"({_num(t.gt)}" if t.gt is not None else None
    high_value = t.le if t.le is not None else t.lt
    if high_value == MAX_INT and not cap:
        high_value = None
    high = None if high_value is None else f"{_num(high_value)}]" if t.le is not None else f"{_num(high_value)})"
    if low and high:
        return f"in {low}, {high}"
    if low:
        return (">= " if low[0] == "[" else "> ") + low[1:]
    if high:
        return ("<= " if high[-1] == "]" else "< ") + high[:-1]
    return ""


def _members(t: mi.Type) -> tuple[mi.Type, ...]:
    return t.types if isinstance(t, mi.UnionType) else (t,)


def _type_text(arg: Arg, t: mi.Type | None = None, *, short: bool = False) -> str:
    """What an argument must be: ``non-negative int``, ``number in (0, 300]``, ``'up' or 'down'``, ``str or null``
    (``short``: the compact form a prompt lists, ``int >= 0``, ``'up' | 'down'``, ``str | null``)."""
    t = arg.type if t is None else t
    sep = " | " if short else " or "
    if isinstance(t, mi.UnionType):
        return sep.join(_type_text(arg, m, short=short) for m in t.types)
    if isinstance(t, mi.LiteralType):
        return sep.join(repr(v) for v in (arg.choices or t.values))
    if isinstance(t, mi.IntType):
        bounds = _bounds(t)
        if not short and bounds == ">= 0":
            return "non-negative int"
        return f"int {bounds}".strip()
    if isinstance(t, mi.FloatType):
        return f"{'' if short else 'a '}number {_bounds(t)}".strip()
    if isinstance(t, mi.StrType):
        if arg.trimmed:
            return "non-empty str" if short else "a non-empty str with no surrounding whitespace"
        return "non-empty str" if t.min_length == 1 else "str"
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.NoneType):
        return "null"
    return type(t).__name__.removesuffix("Type").lower()


def _constraint_text(arg: Arg, value: Any) -> str:
    """What a value of the right type broke: ``in (0, 300]``, ``>= 1``, ``non-empty``."""
    for t in _members(arg.type):
        if isinstance(t, mi.IntType | mi.FloatType) and isinstance(value, int | float):
            if (t.le == MAX_INT or t.lt == MAX_INT) and value > MAX_INT:
                return f"<= {MAX_INT}"
            if math.isnan(value):
                return f"a number {_bounds(t)}".strip()
            return _bounds(t)
        if isinstance(t, mi.StrType) and isinstance(value, str):
            if arg.trimmed:
                return "non-empty with no surrounding whitespace"
            parts = ["non-empty"] if t.min_length == 1 else [f"at least {t.min_length} characters"] \
                if t.min_length else []
            if t.max_length is not None:
                parts.append(f"at most {t.max_length} characters")
            return " and ".join(parts) or "a str"
    return _type_text(arg)


def _unwrap(t: mi.Type) -> tuple[mi.Type, dict[str, Any], dict[str, Any]]:
    """The type under ``Metadata`` layers, with their JSON-schema extras and user extras merged."""
    schema: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    while isinstance(t, mi.Metadata):
        schema.update(t.extra_json_schema or {})
        extra.update(t.extra or {})
        t = t.type
    if isinstance(t, mi.UnionType):
        members = []
        for m in t.types:
            inner, s, e = _unwrap(m)
            schema.update(s)
            extra.update(e)
            members.append(inner)
        t = mi.UnionType(types=tuple(members))
    return t, schema, extra


def _literal_order(annotation: Any) -> tuple[Any, ...]:
    """The values of a ``Literal`` in an annotation, in the order written."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    for inner in typing.get_args(annotation):
        found = _literal_order(inner)
        if found:
            return found
    return ()


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """A JSON schema with every ``$ref`` replaced by its definition and no ``title``s (function schemas for
    OpenAI and vLLM are self-contained)."""
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return _inline({**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    out = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "properties" and isinstance(value, dict):  # argument names, not schema keywords
            out[key] = {name: _inline(prop, defs) for name, prop in value.items()}
        else:
            out[key] = _inline(value, defs)
    return out


class ToolSchema:
    """A suite's agent tools: name -> ``ToolArgs`` subclass. Every method that reads a call raises ``ActionError``
    naming the tool and the argument when the call does not fit."""

    def __init__(self, tools: Mapping[str, type[ToolArgs]]):
        self._structs: dict[str, type[ToolArgs]] = dict(tools)
        self._names_of: dict[type[ToolArgs], str] = {}
        self._args: dict[str, tuple[Arg, ...]] = {}
        for name, cls in self._structs.items():
            if not _TOOL_NAME.fullmatch(name):
                raise ValueError(f"tool name {name!r}: an agent's tool is named like [A-Za-z][A-Za-z0-9_-]* "
                                 "(internal tools start with '_' and are not part of a schema)")
            if not (isinstance(cls, type) and issubclass(cls, ToolArgs)) or cls in self._names_of:
                raise ValueError(f"tool {name!r}: each tool needs its own ToolArgs subclass, got {cls!r}")
            if not (cls.__doc__ or "").strip():
                raise ValueError(f"tool {name!r}: {cls.__name__} needs a docstring (the tool's description)")
            self._names_of[cls] = name
            self._args[name] = self._read_args(cls)
        self.names: tuple[str, ...] = tuple(self._structs)
        self._openai: list[dict[str, Any]] | None = None

    @staticmethod
    def _read_args(cls: type[ToolArgs]) -> tuple[Arg, ...]:
        hints = typing.get_type_hints(cls, include_extras=True)
        out = []
        for f in mi.type_info(cls).fields:
            t, schema, extra = _unwrap(f.type)
            default = f.default if f.default_factory is msgspec.NODEFAULT else f.default_factory()
            out.append(Arg(name=f.name, type=t, required=f.required, default=default,
                           description=str(schema.get("description", "")), trimmed=bool(extra.get("trimmed")),
                           choices=_literal_order(hints.get(f.name))))
        return tuple(out)

    # -- looking up ---------------------------------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._structs

    def struct(self, name: str) -> type[ToolArgs]:
        if name not in self:
            raise ActionError(f"unknown tool {_shown(name)}; expected one of {', '.join(self.names)}")
        return self._structs[name]

    def args(self, name: str) -> tuple[Arg, ...]:
        """The tool's arguments in declaration order (the order a positional action language writes them)."""
        self.struct(name)
        return self._args[name]

    def description(self, name: str) -> str:
        """The tool's docstring, each paragraph on one line."""
        paragraphs = inspect.cleandoc(self.struct(name).__doc__ or "").split("\n\n")
        return "\n\n".join(" ".join(p.split()) for p in paragraphs)

    # -- calls --------------------------------------------------------------------------------------------------
    def decode(self, call: ToolCall) -> ToolArgs:
        """The call's arguments as its tool's Struct (defaults filled in, types as declared)."""
        cls = self.struct(call.name)
        try:
            decoded = msgspec.convert(call.args, cls)
        except msgspec.ValidationError as exc:
            raise ActionError(self._explain(call, str(exc))) from exc
        for arg in self._args[call.name]:
            value = getattr(decoded, arg.name)
            if arg.trimmed and isinstance(value, str) and value != value.strip():
                raise ActionError(f"{call.name}: {arg.name} must be {_constraint_text(arg, value)}, got "
                                  f"{_shown(value)}")
            if isinstance(value, float) and not math.isfinite(value):  # JSON has no NaN: canonical() writes null
                raise ActionError(f"{call.name}: {arg.name} must be a finite number, got {_shown(value)}")
        return decoded

    def to_call(self, args: ToolArgs) -> ToolCall:
        """The normal-form call of a Struct (checked: a Struct built in Python is not type-checked by msgspec)."""
        name = self._names_of.get(type(args))
        if name is None:
            raise ActionError(f"{type(args).__name__} is not a tool of this schema")
        return self.normalize(ToolCall(name=name, args=msgspec.to_builtins(args)))

    def normalize(self, call: ToolCall) -> ToolCall:
        """The call with every default filled in and each value of its declared type: one spelling per call."""
        decoded = self.decode(call)
        return ToolCall(name=call.name, args=msgspec.to_builtins(decoded))

    def _explain(self, call: ToolCall, message: str) -> str:
        tool = call.name
        takes = f"{tool} takes {self.signature(tool)}"
        args_by_name = {a.name: a for a in self._args[tool]}
        if m := _MISSING.fullmatch(message):
            return f"{tool}: missing argument {_shown(m['arg'])}; {takes}"
        if m := _UNKNOWN.fullmatch(message):
            return f"{tool}: unexpected argument {_shown(m['arg'])}; {takes}"
        if m := _NOT_OBJECT.fullmatch(message):
            return f"{tool} takes an object of arguments, got {m['got']}: {_shown(call.args)}; {takes}"
        if message.startswith("Expected `str` - at `key`"):
            return f"{tool}: argument names must be strings; {takes}"
        if (m := _AT_FIELD.fullmatch(message)) and m["arg"] in args_by_name and not m["deeper"]:
            arg = args_by_name[m["arg"]]
            value = call.args.get(arg.name) if isinstance(call.args, dict) else None
            what = m["what"]
            if ", got `" in what or what.startswith("Invalid enum value"):
                return f"{tool}: {arg.name} must be {_type_text(arg)}, got {_shown(value)}"
            return f"{tool}: {arg.name} must be {_constraint_text(arg, value)}, got {_shown(value)}"
        return f"{tool}: {message}"  # a Struct's own check (``__post_init__``) names its argument itself

    # -- what a model reads -------------------------------------------------------------------------------------
    def signature(self, name: str) -> str:
        """``type(element_id: int >= 0, text: str, press_enter_after: bool = true)``'s argument list, or
        ``no arguments``."""
        parts = []
        for arg in self.args(name):
            text = f"{arg.name}: {_type_text(arg, short=True)}"
            if not arg.required:
                text += f" = {msgspec.json.encode(arg.default).decode()}"
            parts.append(text)
        return ", ".join(parts) if parts else "no arguments"

    def listing(self, indent: str = "  ") -> str:
        """One line per tool for a prompt: ``name(arguments): the first paragraph of its description``."""
        lines = []
        for name in self.names:
            summary = self.description(name).split("\n\n")[0]
            args = self.signature(name) if self._args[name] else ""
            lines.append(f"{indent}{name}({args}): {summary}")
        return "\n".join(lines)

    def openai_tools(self) -> list[dict[str, Any]]:
        """OpenAI function definitions, one per tool: the Struct's docstring as the description and its JSON schema,
        self-contained, as the parameters."""
        if self._openai is None:
            structs = list(self._structs.values())
            _, defs = msgspec.json.schema_components(structs, ref_template="#/$defs/{name}")
            tools = []
            for name, cls in self._structs.items():
                parameters = _inline(defs[cls.__name__], defs)
                parameters.pop("description", None)
                parameters.setdefault("properties", {})
                parameters.setdefault("required", [])
                tools.append({"type": "function", "function": {"name": name, "description": self.description(name),
                                                               "parameters": parameters}})
            self._openai = tools
        return copy.deepcopy(self._openai)
