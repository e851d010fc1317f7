"""The codebase's structure, checked: no import cycle at any level, imports only along the written direction, every
background task started in an owning scope, and no production code that nothing calls. CONTRIBUTING.md says why
each rule exists; this file is what makes them hold.

Imports are read from the source (``ast``), at every level: module-level, inside functions, and under
``if TYPE_CHECKING:`` alike, since each is a dependency a reader must follow.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("engine", "envs", "policies")  # pyproject's package-dir: bunshin.engine -> engine/, ...

# The written direction (CONTRIBUTING.md "Dependencies point one way"): records and contracts -> runtime -> suites
# -> policies -> engine records -> engine core -> engine I/O -> commands -> bench -> cli. A module may import
# modules of its own layer or a lower one; the longest prefix names a module's layer.
LAYERS: list[tuple[str, ...]] = [
    ("bunshin.envs.records", "bunshin.envs.errors", "bunshin.envs.seeds", "bunshin.envs.code_version",
     "bunshin.envs.workspace", "bunshin.envs.app", "bunshin.envs.latency", "bunshin.envs.state_image",
     "bunshin.envs.framing"),
    ("bunshin.envs.images",),
    ("bunshin.envs.runtime",),
    ("bunshin.envs", "bunshin.envs.suites", "bunshin.envs.webshop", "bunshin.envs.desktop"),
    ("bunshin.policies.base",),
    ("bunshin.policies",),
    ("bunshin.engine.records", "bunshin.engine.errors", "bunshin.engine.history"),
    ("bunshin.engine",),  # the engine core: admission, episode, sample, rollout, pull, prefix, speculation, ...
    ("bunshin.engine.cluster", "bunshin.engine.adapters", "bunshin.engine.report"),
    ("bunshin.engine.commands",),
    ("bunshin.engine.bench",),
    ("bunshin.engine.cli",),
]
# Siblings of one layer that must not know each other.
INDEPENDENT = [("bunshin.engine.prefix", "bunshin.engine.speculation")]
# Exceptions that are not errors: a fork's clone raises them to unwind to its serve loop.
UNWIND = {"bunshin.envs.runtime.fork.clone.BecameClone", "bunshin.envs.runtime.fork.worker.WorkerBecameClone"}
# Where a task may be created without a TaskGroup: the one nursery helper.
TASK_SCOPE_MODULE = "bunshin.envs.runtime.task_scope"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "bunshin." + ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for root in ROOTS for p in (REPO / root).rglob("*.py")}


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str) -> str | None:
    mods = modules()
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def imported_names(tree: ast.AST, mod: str, is_pkg: bool) -> list[tuple[str, int]]:
    """(dotted name, line) of every import in ``tree``, at every level (``from .x import y`` gives ``pkg.x.y`` and
    ``pkg.x``: ``y`` may be a module or a name in one)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, is_pkg, node)
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names] + [(base, node.lineno)]
    return found


@cache
def import_edges() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, every import statement at every level."""
    edges: dict[str, dict[str, int]] = {}
    for mod, path in modules().items():
        is_pkg = path.name == "__init__.py"
        found = edges.setdefault(mod, {})
        for name, line in imported_names(ast.parse(path.read_text(), str(path)), mod, is_pkg):
            target = _target(name)
            # a package's __init__ importing its own submodules, or a module naming its own package on the way to
            # a sibling, is not a dependency of interest
            if target is None or target == mod or (is_pkg and target.startswith(mod + ".")):
                continue
            if mod.startswith(target + ".") and modules()[target].name == "__init__.py":
                continue
            found.setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges.get(w, {}))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(mod: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (mod == prefix or mod.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"{mod} is in no layer of tests/test_structure.py"
    return rank


def _within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_imports_are_read_at_every_level() -> None:
    """The reader sees imports inside functions and under TYPE_CHECKING (a cycle hidden there is still a cycle)."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
              "def f():\n    import c\n    from ..d import e\n")
    names = {name for name, _ in imported_names(ast.parse(source), "bunshin.pkg.a", False)}
    assert {"typing.TYPE_CHECKING", "bunshin.pkg.b.X", "bunshin.pkg.b", "c", "bunshin.d.e", "bunshin.d"} <= names


def test_no_import_cycle_at_any_level() -> None:
    found = cycles(import_edges())
    assert not found, "import cycles (module, function and TYPE_CHECKING imports):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_every_import_follows_the_written_direction() -> None:
    wrong = []
    for mod, targets in import_edges().items():
        for target, line in targets.items():
            if layer_of(target) > layer_of(mod):
                wrong.append(f"{modules()[mod].relative_to(REPO)}:{line}: {mod} imports {target}, a higher layer")
            for a, b in INDEPENDENT:
                if (_within(mod, a) and _within(target, b)) or (_within(mod, b) and _within(target, a)):
                    wrong.append(f"{modules()[mod].relative_to(REPO)}:{line}: {mod} imports {target} ({a} and {b} "
                                 "are independent)")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("lower", "higher"), [("bunshin.envs", "bunshin.engine"), ("bunshin.envs", "bunshin.policies"),
                                               ("bunshin.policies", "bunshin.engine")])
def test_a_package_never_imports_a_package_above_it(lower: str, higher: str) -> None:
    """The rules the layers encode, said plainly: envs imports neither engine nor policies; policies does not
    import engine."""
    wrong = [f"{m} imports {t}" for m, ts in import_edges().items() if _within(m, lower)
             for t in ts if _within(t, higher)]
    assert not wrong, "\n".join(wrong)


def _task_groups(func: ast.AST) -> set[str]:
    """Names bound by ``async with asyncio.TaskGroup() as name`` in ``func``."""
    names = set()
    for node in ast.walk(func):
        if isinstance(node, ast.AsyncWith | ast.With):
            for item in node.items:
                call = item.context_expr
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute | ast.Name)
                        and getattr(call.func, "attr", getattr(call.func, "id", "")) == "TaskGroup"
                        and isinstance(item.optional_vars, ast.Name)):
                    names.add(item.optional_vars.id)
    return names


def bare_tasks(tree: ast.AST) -> list[int]:
    """Lines that start a task outside a TaskGroup: ``ensure_future``, ``create_task`` on anything but a group."""
    lines = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module)]
    for scope in scopes:
        groups = _task_groups(scope)
        for node in ast.walk(scope):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name == "ensure_future":
                lines.append(node.lineno)
            elif name == "create_task":
                receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
                if not (isinstance(receiver, ast.Name) and receiver.id in groups):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_the_task_check_tells_a_group_from_a_bare_task() -> None:
    source = ("import asyncio\nasync def f(loop):\n    async with asyncio.TaskGroup() as g:\n"
              "        g.create_task(x())\n    loop.create_task(y())\n    asyncio.ensure_future(z())\n")
    assert bare_tasks(ast.parse(source)) == [5, 6]


def test_every_task_is_started_in_an_owning_scope() -> None:
    """No bare ``ensure_future``/``create_task`` in production code: a task belongs to a ``TaskGroup`` or to a
    ``TaskScope`` (envs/runtime/task_scope.py), and ``run_to_end`` awaits what must finish."""
    wrong = []
    for mod, path in modules().items():
        if mod == TASK_SCOPE_MODULE:
            continue
        for line in bare_tasks(ast.parse(path.read_text())):
            wrong.append(f"{path.relative_to(REPO)}:{line}")
    assert not wrong, "tasks started without an owning scope:\n" + "\n".join(wrong)


def test_no_production_code_is_unreferenced() -> None:
    """Every function, method and class in engine/, envs/ and policies/ is used by production code (the VM's
    tree-fork workloads, kmod/treefork/workloads.py, included), or is public API listed, with the reason, in
    tests/vulture_whitelist.py (vulture: references by name, so a method called by name through the worker
    protocol counts)."""
    done = subprocess.run(
        [sys.executable, "-m", "vulture", *ROOTS, "kmod/treefork/workloads.py", "tests/vulture_whitelist.py",
         "--min-confidence", "60"],
        cwd=REPO, capture_output=True, text=True)
    kinds = ("unused function", "unused method", "unused class", "unused property")
    unused = [line for line in done.stdout.splitlines() if any(k in line for k in kinds)]
    assert done.returncode in (0, 3), done.stderr
    assert not unused, "production code nothing calls:\n" + "\n".join(unused)


def test_every_error_is_below_its_package_root() -> None:
    """One error tree per package: every exception class of ``bunshin.engine`` is an ``EngineError``, of
    ``bunshin.envs`` an ``EnvsError``, of ``bunshin.policies`` a ``PolicyError`` (a builtin may be a second base).
    A private class (``_Name``) is a signal caught inside its own module and never escapes it; ``UNWIND`` are not
    errors either (raised in a freshly forked process to unwind its stack to its serve loop)."""
    import importlib
    import inspect

    from bunshin.engine.errors import EngineError
    from bunshin.envs.errors import EnvsError
    from bunshin.policies.base import PolicyError

    roots = {"bunshin.engine": EngineError, "bunshin.envs": EnvsError, "bunshin.policies": PolicyError}
    strays = []
    for mod in modules():
        root = next(r for prefix, r in roots.items() if _within(mod, prefix))
        for name, value in vars(importlib.import_module(mod)).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == mod
                    and not name.startswith("_") and f"{mod}.{name}" not in UNWIND and not issubclass(value, root)):
                strays.append(f"{mod}.{name} is not a {root.__name__}")
    assert not strays, "\n".join(strays)
