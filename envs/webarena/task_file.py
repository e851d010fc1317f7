"""WebArena's own tasks on a user's deployment: ``test.raw.json`` (every task in one JSON list, as libwebarena ships
it), a directory of ``config_files/<id>.json``, or one such file; each task prepared for the deployment or refused,
saying why.

Owns: reading the file(s) (bounded), substituting the deployment's sites in each task's text (as WebArena's
``generate_test_data`` does over the raw file), decoding it (``envs/suites/webarena.WebArenaTask``) and the rules of
what a deployment run can evaluate: a site the deployment lacks is refused naming the site; an evaluator or a
feature we cannot run is refused naming the field (``eval.reference_answers.fuzzy_match`` without a judge model,
an unknown locator function, ...). ``Loaded`` holds both and counts them by site and by evaluator.
Must never: refuse a task without naming the site or the field, or let one bad entry stop the others.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..suites.base import Refusal
from ..suites.errors import TaskFileError
from ..suites.webarena import ANSWER_KINDS, EVAL_TYPES, WebArenaTask
from .sites import SITES, Deployment

MAX_FILE = 64 << 20  # test.raw.json is 0.9 MB; a file far larger is not a task file
# program_html's target URL functions and locator functions WebArena's helpers define (the shopping ones read the
# shop's REST API as its admin)
LATEST_ORDER = "func:shopping_get_latest_order_url()"
URL_FUNCS = frozenset({"func:reddit_get_post_url('__last_url__')", LATEST_ORDER})
LOCATOR_FUNC = re.compile(r"^func:(shopping_get_sku_latest_review_(?:rating|author))\((['\"])[^'\"]+\2\)$"
                          r"|^func:(gitlab_get_project_memeber_role)\(__page__, (['\"])[^'\"]+\4\)$")
_PLACEHOLDER = re.compile(r"__[A-Z_]+__")


@dataclass
class Loaded:
    """What a task file gave: the tasks prepared for the deployment and those refused, with their counts."""

    tasks: list[WebArenaTask] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    refused_sites: list[list[str]] = field(default_factory=list)  # per refusal, the sites its task needs

    def counts(self) -> dict[str, Any]:
        """Prepared and refused tasks by site (a task of two sites counts for each) and by evaluator."""
        by_site: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        by_eval: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for task in self.tasks:
            for site in task.sites:
                by_site[site]["prepared"] += 1
            for kind in task.eval.eval_types:
                by_eval[kind]["prepared"] += 1
        for sites in self.refused_sites:
            for site in sites:
                by_site[site]["refused"] += 1
        return {"prepared": len(self.tasks), "refused": len(self.refused),
                "by_site": {k: dict(v) for k, v in sorted(by_site.items())},
                "by_evaluator": {k: dict(v) for k, v in sorted(by_eval.items())}}


def load(path: str | Path, deployment: Deployment, *, judge: bool = False) -> Loaded:
    """Every task of ``path`` (a JSON list of tasks, a task file, or a directory of task files) prepared for
    ``deployment`` or refused. ``judge``: a judge model is given (``fuzzy_match`` can be evaluated)."""
    path = Path(path)
    loaded = Loaded()
    entries: list[tuple[str, Any]] = []
    if path.is_dir():
        files = sorted(path.rglob("*.json"), key=lambda p: [int(x) if x.isdigit() else x
                                                            for x in re.split(r"(\d+)", p.as_posix())])
        for file in files:
            try:
                entries.append((str(file), _read(file)))
            except TaskFileError as exc:
                loaded.refused.append(Refusal(file=str(file), reason=exc.detail))
                loaded.refused_sites.append([])
    else:
        raw = _read(path)
        if isinstance(raw, list):
            entries = [(f"{path}[{i}]", entry) for i, entry in enumerate(raw)]
        else:
            entries = [(str(path), raw)]
    seen: set[int] = set()
    for where, raw in entries:
        sites = [str(s) for s in raw.get("sites", [])] if isinstance(raw, dict) else []
        try:
            task = prepare(raw, deployment, judge=judge, where=where)
            if task.task_id in seen:
                raise TaskFileError(where, f"task_id {task.task_id} is given twice")
        except TaskFileError as exc:
            loaded.refused.append(Refusal(file=where, reason=exc.detail))
            loaded.refused_sites.append(sites)
            continue
        seen.add(task.task_id)
        loaded.tasks.append(task)
    return loaded


def _read(path: Path) -> Any:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError as exc:
        raise TaskFileError(path, f"cannot read: {exc.strerror}") from exc
    if len(data) > MAX_FILE:
        raise TaskFileError(path, f"over {MAX_FILE >> 20} MiB: not a WebArena task file")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise TaskFileError(path, f"not JSON: {exc}") from exc


def prepare(raw: Any, deployment: Deployment, *, judge: bool, where: str) -> WebArenaTask:
    """One task's JSON, its sites substituted, decoded and checked; ``TaskFileError`` (at ``where``) naming the
    missing site or the field we cannot evaluate."""
    if not isinstance(raw, dict):
        raise TaskFileError(where, f"a task is a JSON object, not {type(raw).__name__}")
    needed = raw.get("sites")
    if not isinstance(needed, list) or not all(isinstance(s, str) for s in needed):
        raise TaskFileError(where, "sites: a list of site names is required")
    unknown = sorted(set(needed) - set(SITES))
    if unknown:
        raise TaskFileError(where, f"sites: {unknown} are not WebArena sites (known: {', '.join(SITES)})")
    missing = deployment.missing(needed)
    if missing:
        raise TaskFileError(where, f"needs site {', '.join(missing)}, not given ("
                                   + ", ".join(f"--site {m}=URL or {SITES[m][1]}" for m in missing) + ")")
    text = deployment.substitute(json.dumps(raw))
    left = sorted(set(_PLACEHOLDER.findall(text)) & {p for p, _ in SITES.values()})
    if left:
        names = [name for name, (p, _) in SITES.items() if p in left]
        raise TaskFileError(where, f"names {', '.join(left)} (site {', '.join(names)}) outside its sites "
                                   f"{needed}, and that site is not given")
    try:
        task = msgspec.json.decode(text, type=WebArenaTask)
    except msgspec.ValidationError as exc:
        raise TaskFileError(where, str(exc)) from exc
    check(task, judge=judge, where=where)
    return task


def check(task: WebArenaTask, *, judge: bool, where: str) -> None:
    """Refuse (``TaskFileError``) what a deployment run cannot evaluate, naming the field."""
    ev = task.eval
    if not ev.eval_types:
        raise TaskFileError(where, "eval.eval_types is empty: the task could never be scored")
    unknown = [t for t in ev.eval_types if t not in EVAL_TYPES]
    if unknown:
        raise TaskFileError(where, f"eval.eval_types {unknown} are not WebArena evaluators (known: "
                                   f"{sorted(EVAL_TYPES)})")
    if "string_match" in ev.eval_types:
        if not ev.reference_answers:
            raise TaskFileError(where, "eval.reference_answers is required by string_match")
        kinds = sorted(set(ev.reference_answers) - ANSWER_KINDS)
        if kinds:
            raise TaskFileError(where, f"eval.reference_answers has {kinds} (known: {sorted(ANSWER_KINDS)})")
        if "fuzzy_match" in ev.reference_answers and not judge:
            raise TaskFileError(where, "eval.reference_answers.fuzzy_match needs a judge model (an LLM, as "
                                       "WebArena's harness asks); none is given")
    if "url_match" in ev.eval_types:
        if not ev.reference_url:
            raise TaskFileError(where, "eval.reference_url is required by url_match")
        if ev.url_note not in ("GOLD in PRED", None):
            raise TaskFileError(where, f"eval.url_note {ev.url_note!r}: WebArena knows only 'GOLD in PRED'")
    if "program_html" in ev.eval_types:
        if not ev.program_html:
            raise TaskFileError(where, "eval.program_html is required by the program_html evaluator")
        for i, target in enumerate(ev.program_html):
            url = target.url.strip()
            if not (url == "last" or url in URL_FUNCS or url.startswith(("http://", "https://"))):
                raise TaskFileError(where, f"eval.program_html[{i}].url {target.url!r}: not 'last', a site's URL "
                                           f"or one of {sorted(URL_FUNCS)}")
            locator = target.locator.strip()
            if locator and not locator.startswith(("document.", "[...document.")) and \
                    not LOCATOR_FUNC.match(locator):
                raise TaskFileError(where, f"eval.program_html[{i}].locator {target.locator!r}: not JavaScript on "
                                           f"document, nor one of WebArena's helper functions")
            if (url == LATEST_ORDER or locator.startswith("func:shopping_")) and "shopping" not in task.sites:
                raise TaskFileError(where, f"eval.program_html[{i}] reads the shopping site's REST API; the "
                                           f"task's sites {task.sites} do not include it")
            kinds = set(target.required_contents)
            if len(kinds) != 1 or not kinds <= {"exact_match", "must_include"}:
                raise TaskFileError(where, f"eval.program_html[{i}].required_contents must have exactly one of "
                                           f"exact_match, must_include; got {sorted(kinds)}")


def libwebarena_tasks() -> Path:
    """libwebarena's ``test.raw.json`` (WebArena's 812 tasks; the extra ``browsergym`` installs libwebarena, its
    data only). Found without importing the package (its modules import nltk, transformers, openai)."""
    spec = importlib.util.find_spec("webarena")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(root) / "test.raw.json").is_file():
            return Path(root) / "test.raw.json"
    raise TaskFileError("webarena/test.raw.json", "libwebarena is not installed (./scripts/setup.sh --browsergym)")
