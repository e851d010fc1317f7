"""WebArena's evaluators against a user's deployment, as its ``evaluation_harness`` runs them: ``string_match`` on the
agent's answer, ``url_match`` on the agent's page, ``program_html`` reading pages in the workspace's Chromium and the
shopping site's REST API as WebArena's helper functions do.

Owns: ``score`` (the product of a task's evaluators; ``fuzzy_match`` asks the judge model given, ``llm_judge.py``); program_html's targets ('last': the agent's page; a URL: a
throw-away tab with the browser's cookies; ``func:reddit_get_post_url('__last_url__')`` and
``func:shopping_get_latest_order_url()``), its locators (JavaScript on ``document``, run as WebArena runs it after
the target's ``prep_actions``, a script that throws reading as ""; an empty locator: the page's HTML; the review
helpers through the REST API with the admin token WebArena's helpers ask for; GitLab's member role on the page), the
value HTML-unescaped and matched (``exact_match``, ``must_include`` with ``|OR|``). Where it differs from WebArena,
on purpose: the page's HTML is ``document.documentElement.outerHTML`` (Playwright's ``page.content()`` adds the
doctype); no fixed 3-second sleep after a page loads (the load event is waited for).
Must never: score a task whose evaluation could not run: a site that does not answer or a page that does not load
raises ``EvaluationFailed`` naming it (the rollout's status), never 0.
"""

from __future__ import annotations

import asyncio
import html
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol

from ..records import ToolCall
from ..suites import webarena
from ..suites.errors import SuiteStepFailed
from ..workspace import Workspace
from .sites import Deployment
from .task_file import LATEST_ORDER, LOCATOR_FUNC

REST_TIMEOUT_S = 20.0
MAX_REST = 16 << 20  # the largest JSON answer read (a site's, a judge model's)
ADMIN = ("admin", "admin1234")  # WebArena's shopping_site_admin, whose token its helpers read the REST API with
_GITLAB_ROLE = """(() => {{
  const accounts = [...document.querySelectorAll("td[data-label='Account'] span.gl-avatar-labeled-sublabel")];
  const at = accounts.findIndex(e => e.outerText === {account});
  const roles = document.querySelectorAll("td.col-max-role span");
  return at >= 0 && roles[at] ? roles[at].outerText : "";
}})()"""


class EvaluationFailed(SuiteStepFailed):
    """An evaluator could not read what it scores (a site that does not answer, a page that did not load): names
    it. The rollout has no score rather than a wrong one."""


def _no_judge(intent: str, reference: str, prediction: str) -> float:
    raise EvaluationFailed("fuzzy_match needs a judge model; the task should have been refused when loaded")


class LanguageJudge(Protocol):
    """A judge model's two questions (``llm_judge.OpenAIJudge``)."""

    def fuzzy(self, intent: str, reference: str, prediction: str) -> float: ...

    def unachievable(self, intent: str, reason: str, prediction: str) -> float: ...


async def score(ws: Workspace, task: webarena.WebArenaTask, answer: str, deployment: Deployment,
                llm: LanguageJudge | None = None) -> float:
    """The task's score for the episode that ended with ``answer`` in ``ws`` (0.0 .. 1.0); ``llm`` judges
    ``fuzzy_match`` (a task that needs it was refused when loaded without one)."""
    result = 1.0
    for kind in task.eval.eval_types:
        if kind == "string_match":  # a judge model may be asked: off the loop
            result *= await asyncio.to_thread(
                webarena.string_match, answer, task.eval.reference_answers or {}, task.intent,
                llm.fuzzy if llm is not None else _no_judge, task.eval.string_note,
                llm.unachievable if llm is not None else _no_judge)
        elif kind == "url_match":
            result *= webarena.url_match(task.eval.reference_url or "", await _agent_url(ws))
        elif kind == "program_html":
            result *= await program_html(ws, task, deployment)
    return result


async def program_html(ws: Workspace, task: webarena.WebArenaTask, deployment: Deployment) -> float:
    result = 1.0
    for target in task.eval.program_html:
        where = target.url.strip()
        url: str | None
        if where == "last":
            url = None
        elif where == LATEST_ORDER:
            url = await asyncio.to_thread(latest_order_url, _site_url(deployment, "shopping"))
        elif where.startswith("func:reddit_get_post_url"):
            url = reddit_post_url(await _agent_url(ws))
        else:
            url = where
        locator = target.locator.strip()
        func = LOCATOR_FUNC.match(locator)
        if not locator:
            selected = await _evaluate(ws, url, "document.documentElement.outerHTML", [])
        elif func and func.group(1):
            sku = locator.split("(", 1)[1].rstrip(")").strip("'\"")
            selected = await asyncio.to_thread(latest_review, _site_url(deployment, "shopping"), sku,
                                               func.group(1).rsplit("_", 1)[1])
        elif func:
            account = locator.split(",", 1)[1].rstrip(")").strip().strip("'\"")
            selected = await _evaluate(ws, url, _GITLAB_ROLE.format(account=json.dumps(f"@{account}")), [])
        else:
            selected = await _evaluate(ws, url, locator, [str(p) for p in target.prep_actions])
        selected = html.unescape(selected)
        required = target.required_contents
        if "exact_match" in required:
            result *= webarena.exact_match(str(required["exact_match"]), selected)
        else:
            for content in required["must_include"]:
                result *= float(any(webarena.must_include(alt, selected) for alt in str(content).split(webarena.OR)))
    return result


async def _agent_url(ws: Workspace) -> str:
    obs = await ws.execute(ToolCall(name="_url", args={}))
    if obs.error:
        raise EvaluationFailed(f"the agent's page: {obs.error}")
    return obs.output


async def _evaluate(ws: Workspace, url: str | None, script: str, prep: list[str]) -> str:
    """WebArena's ``str(page.evaluate(f"() => {locator}"))``: a script that throws reads as ""."""
    obs = await ws.execute(ToolCall(name="_evaluate", args={"url": url, "script": script, "prep": prep}))
    if obs.error:
        if "the page's script failed" in obs.error:
            return ""
        raise EvaluationFailed(f"program_html on {url or 'the agent page'}: {obs.error}")
    value = obs.data.get("value")
    return "" if value is None or value == "" else str(value)


def reddit_post_url(url: str) -> str:
    """WebArena's ``reddit_get_post_url``: a post's or comment's URL cut to the post's."""
    parsed = urllib.parse.urlparse(url)
    parts = parsed.path.split("/")
    if len(parts) < 4 or parts[1] != "f":
        return url
    return f"{parsed.scheme}://{parsed.netloc}/f/{parts[2]}/{parts[3]}/"


def _site_url(deployment: Deployment, name: str) -> str:
    if name not in deployment.sites:
        raise EvaluationFailed(f"the evaluator reads the {name} site, which is not given")
    return deployment.sites[name].url


def http_json(method: str, url: str, body: Any = None, *, token: str | None = None, label: str = "",
              timeout_s: float = REST_TIMEOUT_S, error: type[EvaluationFailed] = EvaluationFailed) -> Any:
    """One JSON request (a bearer ``token`` if given) and its decoded answer, bounded in time and size; every
    failure an ``error`` whose message starts with ``label`` and the URL (the REST API's, the judge model's)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
    where = f"{label}{url} ({method})"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            data = answer.read(MAX_REST + 1)
    except urllib.error.HTTPError as exc:
        raise error(f"{where}: HTTP {exc.code} {exc.reason}") from exc
    except (OSError, urllib.error.URLError) as exc:
        raise error(f"{where}: does not answer ({exc})") from exc
    if len(data) > MAX_REST:
        raise error(f"{where}: an answer over {MAX_REST} bytes")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise error(f"{where}: not JSON") from exc


def _admin_token(shop: str) -> str:
    token = http_json("POST", f"{shop}/rest/default/V1/integration/admin/token",
                      {"username": ADMIN[0], "password": ADMIN[1]})
    if not isinstance(token, str):
        raise EvaluationFailed(f"{shop}: the admin token is not a string: {token!r:.200}")
    return token


def latest_order_url(shop: str) -> str:
    """WebArena's ``shopping_get_latest_order_url``: the newest order's page."""
    query = urllib.parse.urlencode({"searchCriteria[sortOrders][0][field]": "created_at",
                                    "searchCriteria[sortOrders][0][direction]": "DESC",
                                    "searchCriteria[pageSize]": "1"})
    found = http_json("GET", f"{shop}/rest/V1/orders?{query}", token=_admin_token(shop))
    try:
        order_id = int(found["items"][0]["increment_id"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EvaluationFailed(f"{shop}/rest/V1/orders: no order in {found!r:.200}") from exc
    return f"{shop}/sales/order/view/order_id/{order_id}/"


def latest_review(shop: str, sku: str, field: str) -> str:
    """WebArena's ``shopping_get_sku_latest_review_author`` / ``_rating``: the newest review's nickname, or its
    rating in percent; "" when the product has none."""
    reviews = http_json("GET", f"{shop}/rest/V1/products/{urllib.parse.quote(sku)}/reviews",
                        token=_admin_token(shop))
    if not reviews:
        return ""
    try:
        return str(reviews[-1]["nickname"]) if field == "author" else str(reviews[-1]["ratings"][0]["percent"])
    except (KeyError, IndexError, TypeError) as exc:
        raise EvaluationFailed(f"{shop}: a review of {sku} without its {field}: {reviews[-1]!r:.200}") from exc
