"""The desktop's spreadsheet: one sheet of cells per open CSV file, formulas, CSV load and save.

Owns: cell names (``A1`` .. ``ZZZ1000000``, ``$`` anchors accepted), values (numbers and text), formulas parsed by a
small recursive-descent parser (``+ - * / ^``, unary minus, parentheses, cell references, ranges inside
functions, ``SUM AVERAGE MIN MAX COUNT ABS ROUND``), spreadsheet errors as values (``#REF!`` for a reference
outside the sheet's limits, ``#DIV/0!``, ``#VALUE!`` for text in arithmetic, ``#NAME?`` for an unknown function,
``#CIRC!`` for a circular reference; errors propagate), and writing the computed values as CSV.
Must never: ``eval`` anything; a formula that does not parse is refused (``FormulaError``), not stored.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterator

from ..errors import EnvsError

MAX_ROWS = 1_000_000
MAX_COLS = 18_278  # ZZZ

CELL_RE = re.compile(r"^\$?([A-Za-z]{1,3})\$?([0-9]{1,7})$")


class CellError(EnvsError, ValueError):
    """A cell name that is not one (``B0``, ``1A``, ``A-1``)."""


class FormulaError(EnvsError, ValueError):
    """A formula that does not parse."""


class ErrorValue(str):
    """A spreadsheet error shown in a cell (``#DIV/0!``); a str subclass so it prints and saves as itself."""


REF, DIV0, VALUE, NAME, CIRC, NUM = (ErrorValue(e) for e in ("#REF!", "#DIV/0!", "#VALUE!", "#NAME?", "#CIRC!",
                                                             "#NUM!"))

Value = int | float | str | None


def col_index(letters: str) -> int:
    n = 0
    for ch in letters.upper():
        n = n * 26 + (ord(ch) - 64)
    return n - 1


def col_letters(index: int) -> str:
    out = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        out = chr(65 + rem) + out
    return out


def parse_cell(name: str) -> tuple[int, int]:
    """``"B3"`` -> (row 2, col 1), zero-based. ``CellError`` if it is not a cell name within the limits."""
    m = CELL_RE.match(name.strip()) if isinstance(name, str) else None
    if not m:
        raise CellError(f"{name!r} is not a cell name (like A1 or C12)")
    row, col = int(m.group(2)) - 1, col_index(m.group(1))
    if row < 0:
        raise CellError(f"{name!r} is not a cell name (rows start at 1)")
    if row >= MAX_ROWS or col >= MAX_COLS:
        raise CellError(f"{name!r} is outside the sheet (rows 1..{MAX_ROWS}, columns A..ZZZ)")
    return row, col


def cell_name(row: int, col: int) -> str:
    return f"{col_letters(col)}{row + 1}"


def parse_literal(text: str) -> Value:
    """What typing ``text`` into a cell stores: a number if it reads as one, else the text (None when empty)."""
    s = text.strip()
    if s == "":
        return None
    if re.fullmatch(r"[+-]?[0-9]+", s):
        return int(s)
    if re.fullmatch(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?", s):
        f = float(s)
        return f if math.isfinite(f) else text
    return text


def _bounded(r: int | float) -> Value:
    """Exact integers stay exact up to 10**15 and become floats beyond, as a spreadsheet's doubles do: a chain of
    products cannot grow a million-digit integer. Infinite or unrepresentable results are #NUM!."""
    if isinstance(r, int) and abs(r) > 10**15:
        try:
            r = float(r)
        except OverflowError:
            return NUM
    return NUM if isinstance(r, float) and not math.isfinite(r) else r


def format_value(v: Value) -> str:
    """How a computed value is shown and saved: integral numbers without a fraction, others to 10 digits."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        if abs(v) < 10**15:
            return str(v)
        try:
            v = float(v)  # a huge integer shows as a spreadsheet shows it: 1E+20, never 4,300 digits
        except OverflowError:
            return NUM
    if isinstance(v, float):
        if not math.isfinite(v):
            return NUM
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.10g}"
    return str(v)


# -- formulas -----------------------------------------------------------------------------------------------------

TOKEN_RE = re.compile(r"""\s*(?:
    (?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+)
  | (?P<str>"(?:[^"]|"")*")
  | (?P<ref>\$?[A-Za-z]{1,3}\$?[0-9]{1,7}(?![A-Za-z0-9_(]))
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<op>[-+*/^(),:])
)""", re.VERBOSE)


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise FormulaError(f"unexpected {text[pos:].strip()[:10]!r} at position {pos}")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


# AST nodes are tuples: ("num", v) ("str", s) ("ref", r, c) ("range", r1, c1, r2, c2) ("neg", x)
# ("bin", op, a, b) ("call", NAME, [args]) ("err", ErrorValue)
Node = tuple


class _Parser:
    def __init__(self, text: str):
        self.tokens = tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise FormulaError("formula ends too early")
        if value is not None and tok[1] != value:
            raise FormulaError(f"expected {value!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        if not self.tokens:
            raise FormulaError("empty formula")
        node = self.expr()
        if self.peek() is not None:
            raise FormulaError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def _left_assoc(self, ops: str, operand: Callable[[], Node]) -> Node:
        """``operand (op operand)*`` for the operators in ``ops``, folded to the left."""
        node = operand()
        while (tok := self.peek()) and tok[1] in ops and tok[0] == "op":
            self.take()
            node = ("bin", tok[1], node, operand())
        return node

    def expr(self) -> Node:
        return self._left_assoc("+-", self.term)

    def term(self) -> Node:
        return self._left_assoc("*/", self.power)

    def power(self) -> Node:
        node = self.unary()
        if (tok := self.peek()) and tok[1] == "^":
            self.take()
            node = ("bin", "^", node, self.power())
        return node

    def unary(self) -> Node:
        tok = self.peek()
        if tok and tok[0] == "op" and tok[1] in "+-":
            self.take()
            inner = self.unary()
            return ("neg", inner) if tok[1] == "-" else inner
        return self.primary()

    def primary(self) -> Node:
        kind, text = self.take()
        if kind == "num":
            return ("num", float(text) if any(c in text for c in ".eE") else int(text))
        if kind == "str":
            return ("str", text[1:-1].replace('""', '"'))
        if kind == "ref":
            start = self._ref(text)
            if (tok := self.peek()) and tok[1] == ":":
                self.take()
                kind2, text2 = self.take()
                if kind2 != "ref":
                    raise FormulaError(f"a range needs a cell after ':', got {text2!r}")
                end = self._ref(text2)
                if start[0] == "err" or end[0] == "err":
                    return ("err", REF)
                (r1, c1), (r2, c2) = start[1:], end[1:]
                return ("range", min(r1, r2), min(c1, c2), max(r1, r2), max(c1, c2))
            return start
        if kind == "name":
            if (tok := self.peek()) and tok[1] == "(":
                self.take()
                args: list[Node] = []
                if (tok := self.peek()) and tok[1] == ")":
                    self.take()
                else:
                    while True:
                        args.append(self.expr())
                        sep = self.take()
                        if sep[1] == ")":
                            break
                        if sep[1] != ",":
                            raise FormulaError(f"expected ',' or ')' in {text.upper()}(...), got {sep[1]!r}")
                return ("call", text.upper(), args)
            if text.upper() in ("TRUE", "FALSE"):
                return ("num", 1 if text.upper() == "TRUE" else 0)
            return ("err", NAME)
        if text == "(":
            node = self.expr()
            self.take(")")
            return node
        raise FormulaError(f"unexpected {text!r}")

    @staticmethod
    def _ref(text: str) -> Node:
        m = CELL_RE.match(text)
        assert m is not None
        row, col = int(m.group(2)) - 1, col_index(m.group(1))
        if row < 0 or row >= MAX_ROWS or col >= MAX_COLS:
            return ("err", REF)
        return ("ref", row, col)


def parse_formula(text: str) -> Node:
    """Parse the part after ``=``; ``FormulaError`` with what is wrong."""
    return _Parser(text).parse()


def _num(v: Value) -> float | int | ErrorValue:
    if isinstance(v, ErrorValue):
        return v
    if v is None:
        return 0
    if isinstance(v, (int, float)):
        return v
    return VALUE


def _flatten(values: list[Value | list[Value]]) -> Iterator[tuple[Value, bool]]:
    """Each argument value, and whether it came from a range (ranges skip text, as spreadsheets do)."""
    for v in values:
        if isinstance(v, list):
            for x in v:
                yield x, True
        else:
            yield v, False


def _numbers(values: list[Value | list[Value]]) -> list[float | int] | ErrorValue:
    out: list[float | int] = []
    for v, from_range in _flatten(values):
        if isinstance(v, ErrorValue):
            return v
        if isinstance(v, bool):
            out.append(int(v))
        elif isinstance(v, (int, float)):
            out.append(v)
        elif v is None or from_range:
            continue
        else:
            n = parse_literal(v)
            if not isinstance(n, (int, float)):
                return VALUE
            out.append(n)
    return out


def _fn_sum(args: list) -> Value:
    nums = _numbers(args)
    return nums if isinstance(nums, ErrorValue) else sum(nums)


def _fn_average(args: list) -> Value:
    nums = _numbers(args)
    if isinstance(nums, ErrorValue):
        return nums
    return DIV0 if not nums else sum(nums) / len(nums)


def _fn_min(args: list) -> Value:
    nums = _numbers(args)
    return nums if isinstance(nums, ErrorValue) else (min(nums) if nums else 0)


def _fn_max(args: list) -> Value:
    nums = _numbers(args)
    return nums if isinstance(nums, ErrorValue) else (max(nums) if nums else 0)


def _fn_count(args: list) -> Value:
    return sum(1 for v, _ in _flatten(args) if isinstance(v, (int, float)) and not isinstance(v, bool))


def _fn_abs(args: list) -> Value:
    if len(args) != 1 or isinstance(args[0], list):
        return VALUE
    n = _num(args[0])
    return n if isinstance(n, ErrorValue) else abs(n)


def _fn_round(args: list) -> Value:
    if not 1 <= len(args) <= 2 or any(isinstance(a, list) for a in args):
        return VALUE
    n = _num(args[0])
    d = _num(args[1]) if len(args) == 2 else 0
    if isinstance(n, ErrorValue):
        return n
    if isinstance(d, ErrorValue):
        return d
    d = max(-15, min(15, int(d)))  # digits beyond a double's precision change nothing (and 10**1e9 would hang)
    q = 10 ** d
    r = math.floor(abs(n) * q + 0.5) / q  # half away from zero, as spreadsheets round
    r = -r if n < 0 else r
    return int(r) if int(d) <= 0 else r


FUNCTIONS: dict[str, Callable[[list], Value]] = {
    "SUM": _fn_sum, "AVERAGE": _fn_average, "MIN": _fn_min, "MAX": _fn_max, "COUNT": _fn_count,
    "ABS": _fn_abs, "ROUND": _fn_round,
}


class Sheet:
    """One sheet: raw inputs by (row, col) (numbers, text, or formulas as ``"=..."``), computed on demand."""

    def __init__(self, name: str = "Sheet1"):
        self.name = name
        self.inputs: dict[tuple[int, int], Value] = {}
        self.formulas: dict[tuple[int, int], Node] = {}
        self._cache: dict[tuple[int, int], Value] | None = None

    # -- editing ----------------------------------------------------------------------------------------------
    def set(self, name: str, text: str) -> None:
        """Type ``text`` into cell ``name``: ``=...`` is a formula (parsed now), anything else a literal."""
        key = parse_cell(name)
        if not isinstance(text, str):
            text = format_value(text)  # type: ignore[arg-type]
        if text.startswith("=") and len(text) > 1:
            self.formulas[key] = parse_formula(text[1:])
            self.inputs[key] = text
        else:
            self.formulas.pop(key, None)
            value = parse_literal(text)
            if value is None:
                self.inputs.pop(key, None)
            else:
                self.inputs[key] = value
        self._cache = None

    def input_of(self, name: str) -> Value:
        return self.inputs.get(parse_cell(name))

    @property
    def extent(self) -> tuple[int, int]:
        """(rows, cols) spanned by non-empty cells."""
        if not self.inputs:
            return 0, 0
        return max(r for r, _ in self.inputs) + 1, max(c for _, c in self.inputs) + 1

    # -- computing ----------------------------------------------------------------------------------------------
    def value(self, name: str) -> Value:
        return self._value(parse_cell(name), set())

    def value_at(self, row: int, col: int) -> Value:
        return self._value((row, col), set())

    def _value(self, key: tuple[int, int], visiting: set[tuple[int, int]]) -> Value:
        if self._cache is None:
            self._cache = {}
        if key in self._cache:
            return self._cache[key]
        node = self.formulas.get(key)
        if node is None:
            return self.inputs.get(key)
        if key in visiting:
            return CIRC
        visiting.add(key)
        try:
            v = self._eval(node, visiting)
        finally:
            visiting.discard(key)
        if isinstance(v, list) or (isinstance(v, float) and not math.isfinite(v)):  # a range, inf, NaN: no value
            v = VALUE
        self._cache[key] = v
        return v

    def _eval(self, node: Node, visiting: set[tuple[int, int]]) -> Value | list[Value]:
        kind = node[0]
        if kind in ("num", "str"):
            return node[1]
        if kind == "err":
            return node[1]
        if kind == "ref":
            v = self._value((node[1], node[2]), visiting)
            return v
        if kind == "range":
            _, r1, c1, r2, c2 = node
            if (r2 - r1 + 1) * (c2 - c1 + 1) > 1_000_000:
                return REF
            return [self._value((r, c), visiting) for r in range(r1, r2 + 1) for c in range(c1, c2 + 1)
                    if (r, c) in self.inputs]
        if kind == "neg":
            x = self._scalar(node[1], visiting)
            x = _num(x)
            return x if isinstance(x, ErrorValue) else -x
        if kind == "bin":
            _, op, a_node, b_node = node
            a = _num(self._scalar(a_node, visiting))
            if isinstance(a, ErrorValue):
                return a
            b = _num(self._scalar(b_node, visiting))
            if isinstance(b, ErrorValue):
                return b
            if op in ("+", "-", "*"):
                return _bounded(a + b if op == "+" else a - b if op == "-" else a * b)
            if op == "/":
                if b == 0:
                    return DIV0
                q = a / b
                return int(q) if isinstance(a, int) and isinstance(b, int) and q.is_integer() else q
            if op == "^":
                try:
                    r = float(a) ** float(b)  # in floats, as spreadsheets compute: 9^9^9 overflows, never hangs
                except (OverflowError, ZeroDivisionError):
                    return DIV0 if a == 0 else NUM
                return r if isinstance(r, float) and math.isfinite(r) else NUM
        if kind == "call":
            _, fname, arg_nodes = node
            fn = FUNCTIONS.get(fname)
            if fn is None:
                return NAME
            return fn([self._eval(a, visiting) for a in arg_nodes])
        raise AssertionError(f"unknown node {node!r}")

    def _scalar(self, node: Node, visiting: set[tuple[int, int]]) -> Value:
        v = self._eval(node, visiting)
        return VALUE if isinstance(v, list) else v

    def computed_rows(self) -> list[list[str]]:
        rows, cols = self.extent
        return [[format_value(self.value_at(r, c)) for c in range(cols)] for r in range(rows)]

    # -- CSV ----------------------------------------------------------------------------------------------------
    @classmethod
    def from_csv(cls, text: str, name: str = "Sheet1") -> Sheet:
        """Load CSV text: every field is typed in as a literal (a field starting with '=' stays text)."""
        sheet = cls(name)
        for r, row in enumerate(csv.reader(io.StringIO(text))):
            for c, field in enumerate(row):
                value = parse_literal(field)
                if value is not None:
                    sheet.inputs[(r, c)] = value
        return sheet

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for row in self.computed_rows():
            writer.writerow(row)
        return out.getvalue()
