"""WebArena task files (``config_files/<id>.json``) and WebArena's answer and URL evaluators.

Owns: decoding a task file into a typed ``WebArenaTask`` (fields the real benchmark carries that we do not use are
accepted; a missing or mistyped required field is refused with the file's path and the field), refusing tasks the
embedded suite cannot run (another site, an evaluator type we lack) with a message naming what is missing, and the
evaluators that need no browser: ``string_match`` (``exact_match``, ``must_include``, ``fuzzy_match`` through a
pluggable judge) and ``url_match``. The score of a task is the product of its evaluators' scores, as in WebArena.
Must never: score a task it cannot evaluate as 0 silently: it refuses the task instead.
"""

from __future__ import annotations

import collections
import json
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from .errors import TaskFileError

SUPPORTED_SITES = frozenset({"shopping"})
EVAL_TYPES = frozenset({"string_match", "url_match", "program_html"})
ANSWER_KINDS = frozenset({"exact_match", "must_include", "fuzzy_match"})
OR = " |OR| "


class ProgramHtml(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    locator: str
    required_contents: dict[str, Any]
    prep_actions: list[Any] = []  # JavaScript WebArena runs before selecting: we have none, such targets are refused


class Eval(msgspec.Struct, frozen=True, kw_only=True):
    eval_types: list[str]
    reference_answers: dict[str, Any] | None = None
    reference_url: str | None = ""
    program_html: list[ProgramHtml] = []
    url_note: str = "GOLD in PRED"
    string_note: str | None = None
    reference_answer_raw_annotation: str | None = None


class WebArenaTask(msgspec.Struct, frozen=True, kw_only=True):
    """One WebArena task file. Unknown fields are ignored (``storage_state``, ``geolocation``, ...)."""

    task_id: int
    sites: list[str]
    start_url: str
    intent: str
    eval: Eval
    intent_template: str = ""
    intent_template_id: int | None = None
    instantiation_dict: dict[str, Any] = {}
    require_login: bool = False
    require_reset: bool = False
    # Ours, ignored by WebArena's own harness: the template's name and the reference action sequence, in
    # WebArena's action language; an element may be named by role and name, ``click [@button 'Add to Cart']``,
    # and is resolved to its id on the page at the time (ids are per page state, a task file cannot know them).
    bunshin_template: str = ""
    bunshin_reference: list[str] = []


_decoder = msgspec.json.Decoder(WebArenaTask)


def decode_task_file(path: str | Path, decoder: msgspec.json.Decoder[Any]) -> Any:
    """Read and decode one task file; every failure is a TaskFileError naming the file (and, from msgspec, the
    field: "Object missing required field `intent`", "Expected `int`, got `str` - at `$.task_id`")."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TaskFileError(path, f"cannot read: {exc.strerror}") from exc
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise TaskFileError(path, str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise TaskFileError(path, f"not JSON: {exc}") from exc
    except RecursionError as exc:  # msgspec recurses through nested arrays even of a field we ignore
        raise TaskFileError(path, "JSON nested deeper than any task file (the decoder's recursion limit)") from exc


def load_task(path: str | Path) -> WebArenaTask:
    """Read and check one task file; raise TaskFileError naming the file and what is wrong or missing."""
    task = decode_task_file(path, _decoder)
    check_supported(task, path)
    return task


def check_supported(task: WebArenaTask, path: str | Path) -> None:
    other_sites = sorted(set(task.sites) - SUPPORTED_SITES)
    if other_sites:
        raise TaskFileError(path, f"sites {other_sites} are not in the embedded suite (it has: "
                                  f"{sorted(SUPPORTED_SITES)})")
    unknown = [t for t in task.eval.eval_types if t not in EVAL_TYPES]
    if unknown:
        raise TaskFileError(path, f"eval.eval_types {unknown} are not supported (known: {sorted(EVAL_TYPES)})")
    if not task.eval.eval_types:
        raise TaskFileError(path, "eval.eval_types is empty: the task could never be scored")
    if "string_match" in task.eval.eval_types:
        answers = task.eval.reference_answers
        if not answers:
            raise TaskFileError(path, "eval.reference_answers is required by string_match")
        kinds = sorted(set(answers) - ANSWER_KINDS)
        if kinds:
            raise TaskFileError(path, f"eval.reference_answers has {kinds}, not supported (known: "
                                      f"{sorted(ANSWER_KINDS)})")
    if "url_match" in task.eval.eval_types and not task.eval.reference_url:
        raise TaskFileError(path, "eval.reference_url is required by url_match")
    if task.eval.url_note != "GOLD in PRED":
        raise TaskFileError(path, f"eval.url_note {task.eval.url_note!r} is not supported (only 'GOLD in PRED')")
    if "program_html" in task.eval.eval_types and not task.eval.program_html:
        raise TaskFileError(path, "eval.program_html is required by the program_html evaluator")
    for i, target in enumerate(task.eval.program_html if "program_html" in task.eval.eval_types else []):
        if parse_target_url(target.url) is None:
            raise TaskFileError(path, f"eval.program_html[{i}].url {target.url!r} is not supported (known: 'last', "
                                      f"a __SHOPPING__ URL, {sorted(URL_FUNCS)})")
        if parse_locator(target.locator) is None:
            raise TaskFileError(path, f"eval.program_html[{i}].locator {target.locator!r} is not supported (known: "
                                      f"'', document.querySelector('CSS').outerText|innerText|textContent, "
                                      f"func:shopping_get_sku_latest_review_rating|author('SKU'))")
        kinds = set(target.required_contents)
        if len(kinds) != 1 or not kinds <= {"exact_match", "must_include"}:
            raise TaskFileError(path, f"eval.program_html[{i}].required_contents must have exactly one of "
                                      f"exact_match, must_include; got {sorted(kinds)}")
        value = next(iter(target.required_contents.values()))
        if "must_include" in kinds and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise TaskFileError(path, f"eval.program_html[{i}].required_contents.must_include must be a list of "
                                      f"strings, got {value!r}")
        if "exact_match" in kinds and not isinstance(value, str):
            raise TaskFileError(path, f"eval.program_html[{i}].required_contents.exact_match must be a string, "
                                      f"got {value!r}")
        if target.prep_actions:
            raise TaskFileError(path, f"eval.program_html[{i}].prep_actions (JavaScript run before selecting) is "
                                      f"not supported: the text browser runs no scripts")


# -- string_match ---------------------------------------------------------------------------------------------------


def clean_answer(answer: str) -> str:
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def tokens(text: str) -> list[str]:
    """Word tokens, punctuation split off (what WebArena's NLTK tokenizer does for these answers)."""
    return re.findall(r"\w+(?:[.']\w+)*|[^\w\s]", text)


def exact_match(ref: str, pred: str) -> float:
    return float(clean_answer(ref) == clean_answer(pred))


def must_include(ref: str, pred: str, tokenize: bool = False) -> float:
    clean_ref, clean_pred = clean_answer(ref), clean_answer(pred)
    # A single one-word reference must be a whole token: "1" is not in "10".
    if tokenize and len(clean_ref) == 1 and len(tokens(clean_ref)) == 1:
        return float(clean_ref in tokens(clean_pred))
    return float(clean_ref in clean_pred)


Judge = Callable[[str, str, str], float]
"""(intent, reference, prediction) -> score in [0, 1]."""


def token_overlap_judge(intent: str, reference: str, prediction: str) -> float:
    """The offline default for ``fuzzy_match``: deterministic, no model. Scores 1 when every content token of the
    reference (lower-cased words and numbers, stop words dropped) occurs in the prediction, else 0. WebArena asks
    an LLM whether the prediction is semantically equivalent; pass a model-backed judge to reproduce that."""
    stop = {"the", "a", "an", "of", "and", "or", "to", "in", "is", "are", "it", "its", "for", "on", "with"}
    ref = {t for t in tokens(clean_answer(reference)) if t.isalnum() and t not in stop}
    pred = set(tokens(clean_answer(prediction)))
    return float(bool(ref) and ref <= pred)


def string_match(answer: str, reference_answers: dict[str, Any], intent: str,
                 judge: Judge = token_overlap_judge, string_note: str | None = None,
                 ua_judge: Judge | None = None) -> float:
    """WebArena's StringEvaluator: the product of every reference kind's score. For an unachievable task
    (``fuzzy_match: "N/A"``) an answer other than exactly "N/A" is judged against the task's ``string_note`` (the
    reason it is unachievable), as WebArena's ``ua_match`` does (by ``ua_judge``, else ``judge``)."""
    score = 1.0
    for kind, value in reference_answers.items():
        if kind == "exact_match":
            score *= exact_match(str(value), answer)
        elif kind == "must_include":
            values = value if isinstance(value, list) else [value]
            for v in values:
                score *= must_include(str(v), answer, tokenize=len(values) == 1)
        elif kind == "fuzzy_match":
            if value == "N/A":  # the task is not achievable: the answer must say so
                score *= exact_match("N/A", answer)
                if score != 1 and string_note:
                    score = (ua_judge or judge)(intent, string_note, answer)
            else:
                for v in value if isinstance(value, list) else [value]:
                    score *= judge(intent, str(v), answer)
        else:
            raise ValueError(f"unknown reference answer kind {kind!r}")
    return score


# -- url_match ------------------------------------------------------------------------------------------------------


def _clean_url(url: str) -> str:
    return str(url).strip().rstrip("/")


def _parse_url(url: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urllib.parse.urlparse(url)
    return parsed.netloc + parsed.path, urllib.parse.parse_qs(parsed.query)


def url_match(reference_url: str, page_url: str) -> float:
    """WebArena's URLEvaluator, rule "GOLD in PRED": some reference base path occurs in the page's, and every
    reference query parameter has one of its reference values in the page's query."""
    pred_base, pred_query = _parse_url(_clean_url(page_url))
    ref_bases: list[str] = []
    ref_queries: dict[str, set[str]] = collections.defaultdict(set)
    for ref in reference_url.split(OR):
        base, query = _parse_url(_clean_url(ref))
        ref_bases.append(base)
        for key, values in query.items():
            ref_queries[key].update(values)
    score = float(any(base in pred_base for base in ref_bases))
    for key, values in ref_queries.items():
        score *= float(any(v in pred_query.get(key, []) for v in values))
    return score


def expand_url(url: str, shopping_base: str) -> str:
    """Replace WebArena's site placeholders with the embedded suite's addresses."""
    return url.replace("__SHOPPING__", shopping_base.rstrip("/"))


# -- program_html ---------------------------------------------------------------------------------------------------

LATEST_ORDER = "func:shopping_get_latest_order_url()"
URL_FUNCS = frozenset({LATEST_ORDER})
_QUERY = re.compile(r"""^document\.querySelector\((['"])(.+?)\1\)\.(outerText|innerText|textContent)$""")
_REVIEW_FUNC = re.compile(r"""^func:shopping_get_sku_latest_review_(rating|author)\((['"])(\w+)\2\)$""")


class Locator(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "page" | "selector" | "review_rating" | "review_author"
    selector: str = ""
    sku: str = ""


def parse_locator(text: str) -> Locator | None:
    text = text.strip()
    if not text:
        return Locator(kind="page")
    if match := _QUERY.match(text):
        return Locator(kind="selector", selector=match.group(2))
    if match := _REVIEW_FUNC.match(text):
        return Locator(kind=f"review_{match.group(1)}", sku=match.group(3))
    return None


def parse_target_url(text: str) -> str | None:
    """'last', the latest-order function, or a URL (placeholders not yet expanded); None if unsupported."""
    text = text.strip()
    if text == "last" or text in URL_FUNCS:
        return text
    if text.startswith(("__SHOPPING__", "http://", "https://")):
        return text
    return None


PageReader = Callable[[str | None, str], str]
"""(absolute URL, or None for the current page as it is; CSS selector or "" for the whole page) -> its text."""
JsonReader = Callable[[str], Any]
"""(path on the shop, such as ``/rest/V1/orders/latest``) -> the decoded JSON answer."""


def target_urls(targets: list[ProgramHtml], shopping_base: str, latest_order_id: Any = None) -> list[str | None]:
    """The page each target reads: its URL expanded, or None for the agent's page as it is. As in WebArena, a
    target with a URL navigates there, and a later ``last`` reads the page the evaluator navigated to last."""
    urls: list[str | None] = []
    last: str | None = None
    for target in targets:
        url = parse_target_url(target.url)
        if url is None:
            raise ValueError(f"unsupported program_html url {target.url!r}")  # load_task refuses these first
        if url == LATEST_ORDER:
            url = f"{shopping_base.rstrip('/')}/sales/order/view/order_id/{latest_order_id}/"
        if url != "last":
            last = expand_url(url, shopping_base)
        urls.append(last)
    return urls


def needs_latest_order(targets: list[ProgramHtml]) -> bool:
    return any(t.url.strip() == LATEST_ORDER for t in targets)


def program_html(targets: list[ProgramHtml], shopping_base: str, read_page: PageReader,
                 read_json: JsonReader) -> float:
    """WebArena's HTMLContentEvaluator: for each target, go to its URL (or stay on the last page), select the
    locator's text, and require its contents; the score is the product. One deviation, stated: an empty locator
    selects the page's text where WebArena takes its HTML source (same answers for text; no markup to match)."""
    latest = read_json("/rest/V1/orders/latest").get("order_id") if needs_latest_order(targets) else None
    score = 1.0
    for target, page_url in zip(targets, target_urls(targets, shopping_base, latest), strict=True):
        locator = parse_locator(target.locator)
        if locator is None:
            raise ValueError(f"unsupported program_html locator {target.locator!r}")  # refused at load
        if locator.kind in ("page", "selector"):
            selected = read_page(page_url, locator.selector)
        else:
            reviews = read_json(f"/rest/V1/products/{locator.sku}/reviews")
            if not reviews:
                selected = ""
            elif locator.kind == "review_rating":
                selected = str(reviews[-1]["ratings"][0]["percent"])
            else:
                selected = str(reviews[-1]["nickname"])
        required = target.required_contents
        if "exact_match" in required:
            score *= exact_match(str(required["exact_match"]), selected)
        else:
            for content in required["must_include"]:
                score *= float(any(must_include(alt, selected) for alt in str(content).split(OR)))
    return score


def text_expression(selector: str) -> str:
    """The JavaScript a browser evaluates for a program_html read: the outer text of the first element matching
    ``selector`` ("" when none), or the body's text when ``selector`` is empty."""
    if not selector.strip():
        return "(document.body ? document.body.outerText : '')"
    return (f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "return e ? (e.outerText ?? e.textContent ?? '') : ''; })()")


def score(task: WebArenaTask, answer: str, shopping_base: str, page_url: str, read_page: PageReader,
          read_json: JsonReader, judge: Judge = token_overlap_judge) -> float:
    """The task's score, as WebArena scores: the product of its evaluators' (``string_match`` on the agent's final
    answer, ``url_match`` on ``page_url``, the agent's page at the end; ``program_html`` through the readers).
    Whoever holds the agent's browser supplies the URL and the readers: our workspace's browser, or a BrowserGym
    one."""
    result = 1.0
    for kind in task.eval.eval_types:
        if kind == "string_match":
            result *= string_match(answer, task.eval.reference_answers or {}, task.intent, judge,
                                   task.eval.string_note)
        elif kind == "url_match":
            result *= url_match(expand_url(task.eval.reference_url or "", shopping_base), page_url)
        elif kind == "program_html":
            result *= program_html(task.eval.program_html, shopping_base, read_page, read_json)
    return result
