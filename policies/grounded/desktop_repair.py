"""Fixing a failing Python test suite from what the terminal showed: which tests failed and where, the package's
sources, the functions those tests reach, small edits of those functions (the classic mutation operators of
program repair), and the script that tries each edit on a copy of the project in the terminal.

Owns: parsing ``python3 -m unittest`` output (``FAIL:`` / ``ERROR:`` blocks, ``Ran N tests``, ``OK``) and
``grep -n ''`` listings of sources; ranking suspects (functions called on the failing assertion's line first, then
those the failing tests reach through calls); the candidate edits (arithmetic and comparison operators swapped,
``± 1`` dropped or added to an index, operands of ``-`` and ``/`` swapped, ``not`` dropped, ``min``/``max``
swapped, a name replaced by another parameter, a small integer nudged), each checked to parse; the trial script.
Must never: execute the project's code in the policy's process (candidates are only parsed here; they run in the
workspace's terminal), or edit a test.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import dataclass

_BLOCK = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)", re.MULTILINE)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\w+)\n(.*)$', re.MULTILINE)
_GREP = re.compile(r"^([^:\n]+\.py):(\d+):(.*)$")
_CALL = re.compile(r"\b(?:(\w+)\.)?(\w+)\(")
_DEF = re.compile(r"^def (\w+)\(([^)]*)\):")


@dataclass(frozen=True)
class Failure:
    test_id: str  # tests.test_ops.TestOps.test_add
    method: str
    line: str  # the test's source line the traceback stopped at (in the test file)


@dataclass(frozen=True)
class Candidate:
    path: str  # relative to the project, as grep printed it
    line: int  # 1-based
    old: str
    new: str


def passed(output: str | None) -> bool:
    """Whether a unittest run's output says every test passed."""
    return bool(output) and re.search(r"^Ran \d+ tests? in", output, re.MULTILINE) is not None and re.search(
        r"^OK\b", output, re.MULTILINE) is not None


def failures(output: str) -> list[Failure]:
    """The failed and erroring tests of a unittest run, each with the last line of its own test method the
    traceback shows."""
    out = []
    blocks = list(_BLOCK.finditer(output))
    for k, m in enumerate(blocks):
        body = output[m.end():blocks[k + 1].start() if k + 1 < len(blocks) else len(output)]
        line = ""
        for frame in _FRAME.finditer(body):
            if frame.group(3) == m.group(1):
                line = frame.group(4).strip()
        out.append(Failure(test_id=m.group(2), method=m.group(1), line=line))
    return out


def sources(output: str) -> dict[str, list[str]]:
    """``grep -n ''`` output over several files as file -> its lines."""
    files: dict[str, list[str]] = {}
    for raw in output.splitlines():
        m = _GREP.match(raw)
        if m:
            lines = files.setdefault(m.group(1), [])
            n = int(m.group(2))
            lines.extend([""] * (n - len(lines)))
            lines[n - 1] = m.group(3)
    return files


@dataclass(frozen=True)
class Function:
    path: str
    module: str
    name: str
    params: tuple[str, ...]
    start: int  # 0-based line of the def
    end: int  # 0-based, exclusive


def functions(files: dict[str, list[str]]) -> list[Function]:
    """The top-level functions and methods of the files (by indentation), with their parameters."""
    out = []
    for path, lines in files.items():
        module = path.rsplit("/", 1)[-1].removesuffix(".py")
        for i, line in enumerate(lines):
            m = _DEF.match(line.strip())
            if not m:
                continue
            indent = len(line) - len(line.lstrip())
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
                end += 1
            params = tuple(p.split("=")[0].split(":")[0].strip() for p in m.group(2).split(",") if p.strip())
            out.append(Function(path, module, m.group(1), tuple(p for p in params if p != "self"), i, end))
    return out


def _calls(text: str) -> set[str]:
    return {name for _, name in _CALL.findall(text)}


def suspects(fails: list[Failure], tests: dict[str, list[str]], package: dict[str, list[str]]) -> list[Function]:
    """The package's functions the failing tests reach, most suspect first: a function called on a failing
    assertion's line scores most, then one each failing test's method calls, then what those call in turn."""
    by_name = {f.name: f for f in functions(package)}
    test_bodies = {f.name: "\n".join(tests[f.path][f.start:f.end]) for f in functions(tests)}
    score: dict[str, float] = {}
    for fail in fails:
        reached: dict[str, float] = {n: 3.0 for n in _calls(fail.line) if n in by_name}
        for n in _calls(test_bodies.get(fail.method, "")) & set(by_name):
            reached.setdefault(n, 1.0)
        frontier = list(reached)
        while frontier:  # what the reached functions call, less suspect the further away
            f = by_name[frontier.pop()]
            for n in _calls("\n".join(package[f.path][f.start + 1:f.end])):
                if n in by_name and n not in reached:
                    reached[n] = reached[f.name] * 0.5
                    frontier.append(n)
        for n, s in reached.items():
            score[n] = score.get(n, 0.0) + s
    return sorted((by_name[n] for n in score), key=lambda f: (-score[f.name], f.path, f.start))


_ARITH = re.compile(r"(?<=\s)(\+|-|\*|/|//|%)(?=\s)")
_SWAP = re.compile(r"\b(\w+) ([-/]) (\w+)\b")
_INDEX = re.compile(r"\[([^\[\]]+)\]")
_CMP = {"==": "!=", "!=": "==", "<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_CMP_RE = re.compile(r"(?<=\s)(==|!=|<=|>=|<|>)(?=\s)")
_SMALL_INT = re.compile(r"(?<![\w.])(\d)(?![\w.])")


def mutations(line: str, params: tuple[str, ...]) -> list[str]:
    """Single edits of one source line, in a fixed order."""
    code, out = line, []

    def at(span: tuple[int, int], text: str) -> None:
        out.append(code[:span[0]] + text + code[span[1]:])

    for m in re.finditer(r" ([+-]) 1\b", code):  # off by one: drop it
        at(m.span(), "")
    for m in _ARITH.finditer(code):
        for op in ("+", "-", "*", "/"):
            if op != m.group(1):
                at(m.span(), op)
    for m in _SWAP.finditer(code):
        at(m.span(), f"{m.group(3)} {m.group(2)} {m.group(1)}")
    for m in re.finditer(r"\bnot ", code):
        at(m.span(), "")
    for m in _CMP_RE.finditer(code):
        at(m.span(), _CMP[m.group(1)])
    for m in re.finditer(r"\b(min|max)\(", code):
        at(m.span(1), "max" if m.group(1) == "min" else "min")
    for m in re.finditer(r"\b(\w+)\b", code):
        if m.group(1) in params:
            for other in params:
                if other != m.group(1):
                    at(m.span(), other)
    for m in _INDEX.finditer(code):
        if " - 1" not in m.group(1) and " + 1" not in m.group(1):
            for d in (" - 1", " + 1"):
                at(m.span(1), m.group(1) + d)
    for m in _SMALL_INT.finditer(code):
        for d in (-1, 1):
            if int(m.group(1)) + d >= 0:
                at(m.span(), str(int(m.group(1)) + d))
    return list(dict.fromkeys(c for c in out if c != code))


def candidates(files: dict[str, list[str]], order: list[Function], limit: int = 120) -> list[Candidate]:
    """Edits of the suspect functions' bodies that still parse, most suspect function first."""
    out: list[Candidate] = []
    for f in order:
        lines = files[f.path]
        for i in range(f.start + 1, f.end):
            line = lines[i]
            if not line.strip() or line.strip().startswith(("#", '"""')):
                continue
            for new in mutations(line, f.params):
                text = "\n".join(lines[:i] + [new] + lines[i + 1:])
                try:
                    ast.parse(text)
                except SyntaxError:
                    continue
                out.append(Candidate(f.path, i + 1, line, new))
                if len(out) >= limit:
                    return out
    return out


TRIAL = r'''import json, os, shutil, subprocess, sys, tempfile, time
project, tests, cands = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
deadline = time.monotonic() + float(sys.argv[4])
for k, (path, line, new) in enumerate(cands):
    if time.monotonic() > deadline:
        print("out of time"); break
    work = tempfile.mkdtemp()
    copy = os.path.join(work, "p")
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(copy, path)) as f:
        lines = f.read().split("\n")
    lines[line - 1] = new
    with open(os.path.join(copy, path), "w") as f:
        f.write("\n".join(lines))
    run = lambda *a: subprocess.run([sys.executable, "-m", "unittest", *a], cwd=copy, capture_output=True,
                                    timeout=60).returncode == 0
    ok = run("-f", *tests) and run()
    shutil.rmtree(work)
    print(f"candidate {k}: {'passes' if ok else 'fails'}", flush=True)
    if ok:
        break
'''


def trial_command(project: str, tests: list[str], cands: list[Candidate], budget_s: float) -> str:
    """The terminal command that tries ``cands`` in order on copies of ``project`` (the failing tests, then the
    whole suite) and stops at the first that passes both."""
    rows = [[c.path, c.line, c.new] for c in cands]
    args = " ".join(shlex.quote(a) for a in (json.dumps(tests), json.dumps(rows), str(budget_s)))
    return f"python3 - {project} {args} <<'EOF'\n{TRIAL}EOF"


def chosen(output: str | None) -> int | None:
    """Which candidate the trial found passing."""
    m = re.search(r"^candidate (\d+): passes$", output or "", re.MULTILINE)
    return int(m.group(1)) if m else None
